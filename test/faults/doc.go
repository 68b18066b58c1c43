// Package faults is the fault-injection suite of issue 15: the five
// services run as separate `v0m3 <service>` processes of a binary built
// with the failpoints tag, one of them is crashed (SIGKILL) or frozen
// (SIGSTOP) at a step of submit, approve, execute, observe or commit, on
// the file store (the orchestrator restarted) and on Redis (one of two
// orchestrator replicas killed), and after recovery the tests assert, over
// the gRPC API, that every request is in a terminal or honestly waiting
// state, no effect happened twice, no trace event is lost and no
// acknowledged request is lost. The package holds tests only.
package faults
