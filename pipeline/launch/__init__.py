"""Starting a train stage's processes: the launcher (torchrun's elastic agent, in-process), the
node's topology and rendezvous, the devices it picks, the machine's one warm-up, and the
worker each rank starts in."""
