#include "daemon/exchange_stream.hpp"

namespace vllmd::daemon {

void ExchangeStream::begin(int status, std::string_view content_type) {
  // Proxies must neither cache nor buffer an event stream (nginx honours X-Accel-Buffering).
  exchange_->stream_begin(status, content_type,
                          {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
}

void ExchangeStream::write(std::string bytes) { exchange_->stream_write(std::move(bytes)); }

std::size_t ExchangeStream::backlog() const { return exchange_->backlog(); }

bool ExchangeStream::writable() const { return exchange_->writable(); }

void ExchangeStream::on_cancel(std::function<void()> cancelled) {
  exchange_->on_cancel(std::move(cancelled));
}

void ExchangeStream::abort() { exchange_->abort(); }

}  // namespace vllmd::daemon
