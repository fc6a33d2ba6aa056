#pragma once
// api::ResponseStream over an HTTP exchange: how a generation streams its SSE events and
// learns that its client left. Holding the exchange keeps its request alive until the
// generation ends.

#include <string>

#include "common/api/call.hpp"
#include "daemon/http/server.hpp"

namespace vllmd::daemon {

class ExchangeStream final : public api::ResponseStream {
 public:
  explicit ExchangeStream(http::ExchangePtr exchange) : exchange_(std::move(exchange)) {}

  void begin(int status, std::string_view content_type) override;
  void write(std::string bytes) override;
  std::size_t backlog() const override;
  bool writable() const override;
  void on_cancel(std::function<void()> cancelled) override;
  void abort() override;

 private:
  http::ExchangePtr exchange_;
};

}  // namespace vllmd::daemon
