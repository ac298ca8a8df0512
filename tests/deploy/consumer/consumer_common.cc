// Uses the installed shared helpers (ddp::ddprun_common) and the generated
// protocol headers, as a program built against the package would.
#include <iostream>

#include "common/endpoint.h"
#include "ddprun/v1/store.pb.h"

int main(int argc, char** argv) {
  auto endpoint = ddprun::common::ParseEndpoint(argc > 1 ? argv[1] : "");
  if (!endpoint.ok()) {
    std::cerr << endpoint.status() << "\n";
    return 1;
  }
  ddprun::v1::SetRequest request;
  request.set_key("k");
  std::cout << "consumer endpoint " << endpoint->ToString() << " "
            << request.ByteSizeLong() << "\n";
  return 0;
}
