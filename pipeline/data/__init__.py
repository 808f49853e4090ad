"""Fashion-MNIST: fetching and verifying it (the fetch stage), its IDX format, and the
device-resident data and batches training reads."""
