// Engine-call args from a route's query (common/api/engine_args.cpp): vLLM's defaults and
// argument order, and the 400 (with its param) for every value vLLM would refuse.

#include <doctest/doctest.h>

#include <string>

#include "common/api/engine_args.hpp"
#include "common/wire/json_to_msgpack.hpp"
#include "common/wire/msgpack_to_json.hpp"

using vllmd::api::parse_query;
using vllmd::api::Query;

namespace {

// The args as JSON, or "400 <param>: <message>".
std::string args(vllmd::api::EngineArgs build, std::string_view query, std::string_view body = {}) {
  vllmd::api::Call call;
  call.query = parse_query(query);
  if (!body.empty()) call.document = vllmd::wire::json_to_msgpack(body).value();
  auto built = build(call);
  if (!built) {
    return std::to_string(built.error().status) + " " + built.error().param.value_or("") + ": " +
           built.error().message;
  }
  return vllmd::wire::msgpack_to_json(*built).value();
}

}  // namespace

TEST_CASE("sleep: [level, mode], default [1, \"abort\"]") {
  using vllmd::api::sleep_args;
  CHECK(args(sleep_args, "") == R"([1,"abort"])");
  CHECK(args(sleep_args, "level=0&mode=keep") == R"([0,"keep"])");
  CHECK(args(sleep_args, "level=2&mode=wait") == R"([2,"wait"])");
  CHECK(args(sleep_args, "level=x") == "400 query.level: level must be an integer, got 'x'");
  CHECK(args(sleep_args, "level=1.5") == "400 query.level: level must be an integer, got '1.5'");
  CHECK(args(sleep_args, "level=") == "400 query.level: level must be an integer, got ''");
  CHECK(args(sleep_args, "level=-1") == "400 query.level: level must be between 0 and 2, got -1");
  CHECK(args(sleep_args, "level=99999999999") ==
        "400 query.level: level must be an integer, got '99999999999'");
  CHECK(args(sleep_args, "mode=later") ==
        "400 query.mode: 'mode' must be one of abort, wait, keep; got 'later'");
}

TEST_CASE("wake_up: the repeated tags key, or nil") {
  using vllmd::api::wake_up_args;
  CHECK(args(wake_up_args, "") == "[null]");
  CHECK(args(wake_up_args, "other=1&tags%5B%5D=weights") == "[null]");
  CHECK(args(wake_up_args, "tags=weights") == R"([["weights"]])");
  CHECK(args(wake_up_args, "tags=weights&tags=kv_cache&tags=scheduling") ==
        R"([["weights","kv_cache","scheduling"]])");
  CHECK(args(wake_up_args, "tags=") ==
        "400 query.tags: tags must be weights, kv_cache or scheduling, got ''");
}

TEST_CASE("pause and reset_prefix_cache: vLLM's order and defaults") {
  using vllmd::api::pause_args;
  using vllmd::api::reset_prefix_cache_args;
  CHECK(args(pause_args, "") == R"(["abort",true])");
  CHECK(args(pause_args, "mode=keep&clear_cache=False") == R"(["keep",false])");
  CHECK(args(pause_args, "clear_cache=2") ==
        "400 clear_cache: 'clear_cache' must be a boolean, got '2'");
  CHECK(args(reset_prefix_cache_args, "reset_external=on") == "[false,true]");
}

TEST_CASE("collective_rpc: [method, timeout as a float64, args, kwargs], losslessly") {
  using vllmd::api::rpc_args;
  CHECK(args(rpc_args, "", R"({"method":"reload_weights"})") == R"(["reload_weights",null,[],{}])");
  CHECK(args(rpc_args, "",
             R"({"method":"echo_args_kwargs","args":["arg1",2],"kwargs":{"key1":{"n":[1,2.5]}},)"
             R"("timeout":1.5})") ==
        R"(["echo_args_kwargs",1.5,["arg1",2],{"key1":{"n":[1,2.5]}}])");
  CHECK(args(rpc_args, "", R"({"method":"m","timeout":900,"args":null})") ==
        R"(["m",900.0,[],{}])");
  CHECK(args(rpc_args, "", R"({"args":[]})") == "400 method: Missing 'method' in request body");
  CHECK(args(rpc_args, "", R"({"method":7})") == "400 method: 'method' must be a string");
  CHECK(args(rpc_args, "", R"({"method":"m","args":"ab"})") == "400 args: 'args' must be a list");
  CHECK(args(rpc_args, "", R"({"method":"m","kwargs":[1]})") ==
        "400 kwargs: 'kwargs' must be a JSON object");
  CHECK(args(rpc_args, "", R"({"method":"m","timeout":"5"})") ==
        "400 timeout: 'timeout' must be a number or null");
}
