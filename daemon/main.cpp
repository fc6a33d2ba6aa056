#include "daemon/daemon.hpp"

int main(int argc, char** argv) { return vllmd::daemon::run(argc, argv); }
