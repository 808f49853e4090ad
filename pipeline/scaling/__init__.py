"""Answers for N devices from one: each strategy's step at N, its computation measured on this
device by the strategy's own code (under torch's fake process group, which runs one rank of a
world of N with no communication) and its communication modelled over a named link. Every
figure made here is a prediction, and says so wherever it is shown."""
