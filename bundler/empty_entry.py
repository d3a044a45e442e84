"""The empty program frozen with the bundle's exact options: the start-up floor the benchmark measures."""
