#include "daemon/http/exchange.hpp"

#include "common/util/log.hpp"
#include "daemon/http/mailbox.hpp"

namespace vllmd::daemon::http {

Exchange::Exchange(std::shared_ptr<Mailbox> mailbox, std::uint64_t connection, Request request)
    : mailbox_(std::move(mailbox)), connection_(connection), request_(std::move(request)) {}

Exchange::~Exchange() {
  const State state = state_.load();
  if (state == State::kOpen) {
    util::log::error(
        "a request was dropped without an answer: ", util::log::escaped(request_.head.method), " ",
        util::log::escaped(request_.head.target));
    respond(error_response(api::server_error("internal error: the request got no answer")));
  } else if (state == State::kStreaming) {
    send({}, true, true);  // a cut stream tells the client something went wrong
  }
}

bool Exchange::answered() const { return state_.load() != State::kOpen; }

void Exchange::send(std::string bytes, bool last, bool close) {
  mailbox_->post(Mailbox::Delivery{connection_, std::move(bytes), last, close});
}

void Exchange::respond(const Response& response) {
  State expected = State::kOpen;
  if (!state_.compare_exchange_strong(expected, State::kDone)) return;
  const bool keep_alive = request_.head.keep_alive && !response.close && !mailbox_->stopping;
  send(serialize(response, keep_alive), true, !keep_alive);
}

void Exchange::stream_begin(int status, std::string_view content_type, const Headers& headers) {
  State expected = State::kOpen;
  if (!state_.compare_exchange_strong(expected, State::kStreaming)) return;
  const bool chunked = request_.head.minor_version == 1;
  keep_alive_ = chunked && request_.head.keep_alive && !mailbox_->stopping;
  send(serialize_stream_head(status, content_type, headers, keep_alive_, chunked), false, false);
}

void Exchange::stream_write(std::string_view data) {
  if (state_.load() != State::kStreaming || data.empty()) return;
  send(request_.head.minor_version == 1 ? chunk(data) : std::string(data), false, false);
}

void Exchange::stream_end() {
  State expected = State::kStreaming;
  if (!state_.compare_exchange_strong(expected, State::kDone)) return;
  send(request_.head.minor_version == 1 ? std::string(kLastChunk) : std::string(), true,
       !keep_alive_);
}

}  // namespace vllmd::daemon::http
