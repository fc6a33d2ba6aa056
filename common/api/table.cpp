#include "common/api/table.hpp"

namespace vllmd::api {

const Route* find_route(std::string_view path) {
  for (const Route& route : kRoutes) {
    if (route.path == path) return &route;
  }
  return nullptr;
}

const Route& route_for(Operation operation) {
  for (const Route& route : kRoutes) {
    if (route.operation == operation) return route;
  }
  return kRoutes.front();  // unreachable: every Operation has a row
}

}  // namespace vllmd::api
