// The wheel's one executable: runs ddprun-rendezvous or ddprun-relay when
// started under that name (the wheel's scripts exec it so), else ddprun.
#include <string_view>

int DdprunMain(int argc, char** argv);
int DdprunRendezvousMain(int argc, char** argv);
int DdprunRelayMain(int argc, char** argv);

int main(int argc, char** argv) {
  std::string_view name = argc > 0 ? argv[0] : "ddprun";
  if (size_t slash = name.rfind('/'); slash != std::string_view::npos) {
    name.remove_prefix(slash + 1);
  }
  if (name == "ddprun-rendezvous") return DdprunRendezvousMain(argc, argv);
  if (name == "ddprun-relay") return DdprunRelayMain(argc, argv);
  return DdprunMain(argc, argv);
}
