"""What tests and benchmarks share: tiny deterministic environments and
policies, test hosts (network namespaces, a relay), a distributed run's
processes, replay audits, and (bench/) the pieces of benchmarks/ that tests
check. Nothing in the package imports it."""
