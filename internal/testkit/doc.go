// Package testkit holds what the tests of every package share, so each
// test says what it checks instead of how it gets there. Use it rather
// than writing another copy.
//
// Waiting (eventually.go): Eventually polls for a state the test waits
// for but does not cause and fails naming it; EventuallyWithin takes a
// longer bound (a restart, a cluster); EventuallySucceeds retries a call
// until it works and reports its last error; Within reports instead of
// failing, for a goroutine or a test that collects violations. No test
// sleeps and then asserts that nothing happened: wait for an observable
// event that proves the thing could have happened (a later record
// through the same queue, a later rescan's work, a pass counter), then
// assert.
//
// Identity (identity.go): As(m, person) calls "as this person" with a
// token from any Minter (a *suite.Suite, an *identity.DevIssuer, a
// *Guarded); person is a Person or any struct of the same two fields
// (scenario.Person). AsUser and AsService give the context a handler
// sees once the guard admitted a person or a peer service, for tests that
// call handlers in process. identitytest.As and ServerOptions name the
// caller of a unit test's RPCs without tokens.
//
// Time (clock.go): Clock is a fake clock to hand a server as its Now and
// Advance past an expiry; NewClock stands still, NewOffsetClock is the
// wall clock plus what was advanced.
//
// Serving one service (server.go): Serve runs a service's gRPC server in
// memory (bufconn) with the options given (identitytest.ServerOptions for
// a named caller) and Dial connects to it; Stop closes both, so a test
// can restart the service on the same store. ServeGuarded serves it as
// the suite does, behind the real guard and access table with mutual
// TLS from a fresh development CA: Peer connects as a peer service,
// Caller as a product caller whose person As names. Because testkit
// imports internal/serve and internal/identity, those packages' own
// in-package tests cannot use it (their _test packages can).
//
// Also: SyncBuffer (a log sink read while written), ListenLoopback and
// FreeLoopbackAddr (ports a child process can take), WritableDir and
// ReachableDir (directories other uids use), BuildBinaries, Script and
// EnvtestAssets, the pinned third-party MCP servers, and
// SpoolConformance for every store's retry spool.
package testkit
