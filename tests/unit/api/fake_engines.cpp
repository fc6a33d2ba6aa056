#include "tests/unit/api/fake_engines.hpp"

#include <algorithm>
#include <utility>

#include "common/wire/msgpack_codec.hpp"
#include "common/wire/msgpack_to_json.hpp"

namespace vllmd::test {

using engine::CallError;
using engine::CallErrorKind;
using engine::EngineState;
using engine::EngineStatus;

namespace {

template <typename Pack> Reply packed(Pack pack) {
  wire::StringBuffer buffer;
  wire::Packer packer(buffer);
  pack(packer);
  return buffer.take();
}

// The worker method of collective_rpc args ([method, nil, [], {kwargs}]), or empty.
std::string worker_method_of(std::string_view method, const std::string& args) {
  if (method != "collective_rpc") return {};
  auto handle = wire::decode(args);
  if (!handle) return {};
  const msgpack::object& object = handle->get();
  if (object.type != msgpack::type::ARRAY || object.via.array.size == 0) return {};
  const auto name = wire::as_str(object.via.array.ptr[0]);
  return name ? std::string(*name) : std::string();
}

}  // namespace

Reply nil() {
  return packed([](wire::Packer& packer) { packer.pack_nil(); });
}
Reply string_reply(std::string_view text) {
  return packed([text](wire::Packer& packer) { wire::pack_str(packer, text); });
}
Reply bool_reply(bool value) {
  return packed([value](wire::Packer& packer) { packer.pack(value); });
}
Reply failed(std::string message, bool sent) {
  return tl::unexpected(CallError{CallErrorKind::kFailed, std::move(message), sent});
}
Reply timed_out(std::string message) {
  return tl::unexpected(CallError{CallErrorKind::kTimeout, std::move(message), true});
}
Reply unavailable(std::string message, bool sent) {
  return tl::unexpected(CallError{CallErrorKind::kUnavailable, std::move(message), sent});
}

bool RecordedCall::sent_to(int rank) const {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end() &&
         std::find(refused.begin(), refused.end(), rank) == refused.end();
}

FakeEngines::FakeEngines(int ranks) {
  for (int rank = 0; rank < ranks; ++rank) {
    EngineStatus status;
    status.rank = rank;
    status.state = EngineState::kReady;
    status.admissions = status.incarnation = 1;
    engines_.push_back(status);
  }
  admissions_ = static_cast<std::uint64_t>(ranks);
}

void FakeEngines::set_state(int rank, EngineState state, std::string reason) {
  {
    std::lock_guard lock(mutex_);
    EngineStatus& engine = engines_.at(static_cast<std::size_t>(rank));
    engine.state = state;
    engine.reason = std::move(reason);
  }
  changed(rank);
}

void FakeEngines::restart(int rank) {
  {
    std::lock_guard lock(mutex_);
    EngineStatus& engine = engines_.at(static_cast<std::size_t>(rank));
    ++admissions_;
    engine.incarnation = ++engine.admissions;
    engine.state = EngineState::kReady;
    engine.reason.clear();
  }
  changed(rank);
}

void FakeEngines::changed(int rank) {
  if (on_state_change) on_state_change(status(rank));
}

EngineStatus FakeEngines::status(int rank) const {
  std::lock_guard lock(mutex_);
  return engines_.at(static_cast<std::size_t>(rank));
}

void FakeEngines::set_responder(Responder responder) {
  std::lock_guard lock(mutex_);
  responder_ = std::move(responder);
}

int FakeEngines::data_parallel_size() const {
  std::lock_guard lock(mutex_);
  return static_cast<int>(engines_.size());
}

std::vector<EngineStatus> FakeEngines::engines() const {
  std::lock_guard lock(mutex_);
  return engines_;
}

bool FakeEngines::all_ready() const {
  std::lock_guard lock(mutex_);
  return std::all_of(engines_.begin(), engines_.end(), [](const EngineStatus& engine) {
    return engine.state == EngineState::kReady;
  });
}

std::uint64_t FakeEngines::admissions() const {
  std::lock_guard lock(mutex_);
  return admissions_;
}

// What EngineCalls promises: a rank not ready, or not the incarnation the call expects, fails
// at once and is never sent the call.
std::optional<std::string> FakeEngines::refusal(int rank,
                                                const engine::CallOptions& options) const {
  if (rank < 0 || static_cast<std::size_t>(rank) >= engines_.size()) {
    return "no engine with rank " + std::to_string(rank);
  }
  const EngineStatus& engine = engines_[static_cast<std::size_t>(rank)];
  const auto index = static_cast<std::size_t>(rank);
  const std::uint64_t expected =
      index < options.incarnations.size() ? options.incarnations[index] : 0;
  if (expected != 0 && expected != engine.incarnation) {
    return "engine rank " + std::to_string(rank) + " restarted (incarnation " +
           std::to_string(expected) + ", now " + std::to_string(engine.incarnation) + ")";
  }
  if (engine.state == EngineState::kReady) return std::nullopt;
  std::string why =
      "engine rank " + std::to_string(rank) + " is " + std::string(state_name(engine.state));
  return engine.reason.empty() ? why : why + " (" + engine.reason + ")";
}

void FakeEngines::call_all_async(std::string_view method, const ArgParts& args,
                                 const engine::CallOptions& options, Completion done) {
  std::vector<int> ranks(static_cast<std::size_t>(data_parallel_size()));
  for (std::size_t i = 0; i < ranks.size(); ++i) ranks[i] = static_cast<int>(i);
  call_ranks_async(ranks, method, args, options, std::move(done));
}

void FakeEngines::call_ranks_async(const std::vector<int>& ranks, std::string_view method,
                                   const ArgParts& args, const engine::CallOptions& options,
                                   Completion done) {
  std::string joined;
  for (const std::string_view part : args) joined += part;
  RecordedCall call;
  call.method = std::string(method);
  call.worker_method = worker_method_of(method, joined);
  call.args_json = wire::msgpack_to_json(joined).value_or("<undecodable args>");
  call.args = std::move(joined);
  call.ranks = ranks;
  call.options = options;
  Open open;
  open.done = std::move(done);
  Responder responder;
  {
    std::lock_guard lock(mutex_);
    call.id = calls_.size();
    for (const int rank : ranks) {
      const auto why = refusal(rank, options);
      if (why) call.refused.push_back(rank);
      open.replies.push_back(why ? std::optional<Reply>(unavailable(*why)) : std::nullopt);
    }
    calls_.push_back(call);
    open_.emplace(call.id, std::move(open));
    responder = responder_;
  }
  for (const int rank : ranks) {
    if (!responder || !call.sent_to(rank)) continue;
    if (auto reply = responder(call, rank)) answer(call.id, rank, std::move(*reply));
  }
  finish_if_answered(call.id);
}

bool FakeEngines::answer(std::size_t id, int rank, Reply reply) {
  {
    std::lock_guard lock(mutex_);
    const auto found = open_.find(id);
    if (found == open_.end()) return false;
    const std::vector<int>& ranks = calls_[id].ranks;
    const auto position = std::find(ranks.begin(), ranks.end(), rank);
    if (position == ranks.end()) return false;
    std::optional<Reply>& slot = found->second.replies[std::size_t(position - ranks.begin())];
    if (slot) return false;
    slot = std::move(reply);
  }
  finish_if_answered(id);
  return true;
}

void FakeEngines::answer_all(std::size_t id, const Reply& reply) {
  for (const int rank : call(id).ranks) answer(id, rank, reply);
}

void FakeEngines::finish_if_answered(std::size_t id) {
  std::vector<engine::EngineReply> replies;
  Completion done;
  {
    std::lock_guard lock(mutex_);
    const auto found = open_.find(id);
    if (found == open_.end()) return;
    Open& open = found->second;
    if (std::any_of(open.replies.begin(), open.replies.end(),
                    [](const std::optional<Reply>& reply) { return !reply; })) {
      return;
    }
    for (std::size_t i = 0; i < open.replies.size(); ++i) {
      replies.push_back({calls_[id].ranks[i], std::move(*open.replies[i])});
    }
    done = std::move(open.done);
    open_.erase(found);
  }
  if (done) done(std::move(replies));
}

std::vector<RecordedCall> FakeEngines::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

RecordedCall FakeEngines::call(std::size_t id) const {
  std::lock_guard lock(mutex_);
  return calls_.at(id);
}

std::size_t FakeEngines::call_count() const {
  std::lock_guard lock(mutex_);
  return calls_.size();
}

std::vector<std::string> FakeEngines::names(std::size_t from) const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (std::size_t i = from; i < calls_.size(); ++i) out.push_back(calls_[i].name());
  return out;
}

bool FakeEngines::pending(std::size_t id) const {
  std::lock_guard lock(mutex_);
  return open_.count(id) > 0;
}

}  // namespace vllmd::test
