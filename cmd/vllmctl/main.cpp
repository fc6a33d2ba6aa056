#include "cmd/vllmctl/cli.hpp"

int main(int argc, char** argv) { return vllmd::vllmctl::run(argc, argv); }
