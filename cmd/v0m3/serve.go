package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/v0m3/v0m3/demo/fixture/fixturedirect"
	"github.com/v0m3/v0m3/internal/identity"
	"github.com/v0m3/v0m3/internal/serve"
	"github.com/v0m3/v0m3/internal/telemetry"
	"github.com/v0m3/v0m3/services/orchestrator"
	"github.com/v0m3/v0m3/services/policy"
	"github.com/v0m3/v0m3/suite"
)

// defaultPorts are the loopback ports `v0m3 dev` and the single-service
// commands listen on by default; the README's grpcurl examples use them.
var defaultPorts = map[string]int{
	suite.Orchestrator: 7400,
	suite.Registry:     7401,
	suite.Policy:       7402,
	suite.Evidence:     7403,
	suite.Adapter:      7404,
}

func defaultAddr(name string) string {
	return "127.0.0.1:" + strconv.Itoa(defaultPorts[name])
}

// runService serves one service until ctx ends.
func runService(ctx context.Context, name string, args []string, stderr io.Writer) error {
	fs := newFlags(name, stderr)
	listen := fs.String("listen", defaultAddr(name), "address to serve gRPC on")
	dataDir := fs.String("data-dir", "./.v0m3-data", "directory for the embedded store")
	storeURL := fs.String("store", "", "store URL: file:///dir or redis://host:port/db?prefix=name (empty = file store in --data-dir)")
	policyFile := fs.String("policy-file", "", "Cedar policy file (policy service; empty = built-in default)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := addPprofFlag(fs)
	metricsAddr := addMetricsFlag(fs)
	idf := addIdentityFlags(fs)
	rf := addReachFlags(fs, false)
	callTimeout := addInternalCallTimeoutFlag(fs)
	callerRate := addCallerRateFlags(fs)
	var replica struct {
		id            *string
		ttl, interval *time.Duration
	}
	var (
		mcpf *mcpFlags
		bf   *budgetFlags
	)
	if name == suite.Policy {
		bf = addBudgetFlags(fs)
	}
	if name == suite.Orchestrator {
		mcpf = addMCPFlags(fs, "")
		replica.id = fs.String("replica-id", "", "this replica's name as the owner of in-flight requests (empty = a random id)")
		replica.ttl = fs.Duration("lease-ttl", orchestrator.DefaultLeaseTTL, "how long a replica's claim on an in-flight request lasts without renewal; another replica takes the request over only after it")
		replica.interval = fs.Duration("recovery-interval", orchestrator.DefaultRecoveryInterval, "how often unsettled requests no replica owns are recovered")
	}
	peers := map[string]*string{}
	for _, p := range suite.Names {
		if p != name {
			peers[p] = fs.String(p+"-addr", defaultAddr(p), "address of the "+p+" service")
		}
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	id, err := idf.serviceIdentity(ctx, name)
	if err != nil {
		return err
	}
	rate, err := callerRate.limits()
	if err != nil {
		return err
	}
	cfg := suite.Config{
		Reach:           rf.reach(),
		AdapterSessions: rf.sessions(),
		Identity:        id,
		DataDir:         *dataDir,
		Store:           *storeURL,
		Services:        []string{name},
		Listen:          map[string]string{name: *listen},
		Peers:           map[string]string{},
		PolicyFile:      *policyFile,
		Log:             log,
		// Every call to a peer is bounded (the adapter's Execute and
		// Discover by their own bounds).
		InternalCallTimeout: *callTimeout,
		CallerRateLimits:    rate,
	}
	for p, addr := range peers {
		cfg.Peers[p] = *addr
	}
	if mcpf != nil {
		cfg.MCP = mcpf.config()
	}
	if bf != nil {
		cfg.TaskBudget, cfg.RequesterBudget = bf.task, bf.requester
	}
	if replica.id != nil {
		cfg.Replica = suite.Replica{ID: *replica.id, LeaseTTL: *replica.ttl, RecoveryInterval: *replica.interval}
	}
	// Before anything serves: a refused address starts nothing.
	if _, err := startPprof(ctx, *pprofAddr, log); err != nil {
		return err
	}
	_, shutdown, err := startTelemetry(ctx, name, *metricsAddr, log)
	if err != nil {
		return err
	}
	defer shutdown()
	s, err := suite.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	<-ctx.Done()
	s.Close()
	return s.Err()
}

// runDev serves all five services in one process until ctx ends.
func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("dev", stderr)
	dataDir := fs.String("data-dir", "./.v0m3-data", "directory for the embedded stores")
	storeURL := fs.String("store", "", "store URL: file:///dir or redis://host:port/db?prefix=name (empty = file stores in --data-dir)")
	host := fs.String("host", "127.0.0.1", "host to listen on")
	portBase := fs.Int("port-base", 7400, "orchestrator port; registry, policy, evidence, adapter follow (+1..+4); 0 = ephemeral ports")
	policyFile := fs.String("policy-file", "", "Cedar policy file (empty = built-in default)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	pprofAddr := addPprofFlag(fs)
	metricsAddr := addMetricsFlag(fs)
	idf := addIdentityFlags(fs)
	rf := addReachFlags(fs, true)
	callTimeout := addInternalCallTimeoutFlag(fs)
	callerRate := addCallerRateFlags(fs)
	pkiDir := fs.String("pki-dir", "", "where the development CA and token issuer live (default <data-dir>/pki); dev processes given one dir trust each other")
	bf := addBudgetFlags(fs)
	mcpf := addMCPFlags(fs, "default: --host at --port-base+10; \"off\" serves none")
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		return err
	}
	rate, err := callerRate.limits()
	if err != nil {
		return err
	}
	if *mcpf.addr == "" {
		*mcpf.addr = *host + ":0"
		if *portBase != 0 {
			*mcpf.addr = fmt.Sprintf("%s:%d", *host, *portBase+10)
		}
	}
	if *idf.caFile != "" || *idf.certFile != "" || *idf.keyFile != "" {
		return usageError{"v0m3 dev makes its own CA and certificates; --tls-* files are for single services"}
	}
	// v0m3 dev always accepts development tokens (`v0m3 token`), and also
	// those of a real issuer when one is configured.
	if *pkiDir == "" {
		*pkiDir = filepath.Join(*dataDir, "pki")
	}
	dev, err := identity.NewDev(*pkiDir)
	if err != nil {
		return err
	}
	devAuthn, err := dev.Authenticator()
	if err != nil {
		return err
	}
	authn, err := idf.authenticator(ctx, devAuthn)
	if err != nil {
		return err
	}
	id := &suite.Identity{Insecure: *idf.insecure, Authn: authn}
	if !*idf.insecure {
		id.Creds = dev.Credentials
	}
	listen := map[string]string{}
	for name, port := range defaultPorts {
		if *portBase == 0 {
			listen[name] = *host + ":0"
		} else {
			listen[name] = fmt.Sprintf("%s:%d", *host, port-defaultPorts[suite.Orchestrator]+*portBase)
		}
	}
	profiles, err := startPprof(ctx, *pprofAddr, log)
	if err != nil {
		return err
	}
	metricsAt, shutdown, err := startTelemetry(ctx, "dev", *metricsAddr, log)
	if err != nil {
		return err
	}
	defer shutdown()
	s, err := suite.Start(ctx, suite.Config{DataDir: *dataDir, Store: *storeURL, Listen: listen, PolicyFile: *policyFile, Log: log, Identity: id, Reach: rf.reach(),
		TaskBudget: bf.task, RequesterBudget: bf.requester, AdapterSessions: rf.sessions(), InternalCallTimeout: *callTimeout, MCP: mcpf.config(), CallerRateLimits: rate,
		// The development suite has the demo's direct adapter; a deployed
		// adapter (runService) has none.
		Direct: fixturedirect.Sources()})
	if err != nil {
		return err
	}
	defer s.Close()
	fmt.Fprintf(stdout, "v0m3 dev: data in %s\n", *dataDir)
	for _, name := range suite.Names {
		fmt.Fprintf(stdout, "  %-13s %s\n", name, s.Addr[name])
	}
	if s.MCPURL != "" {
		fmt.Fprintf(stdout, "  %-13s %s/tasks/<task_id>/mcp (StartTask with mcp_access)\n", "task MCP", s.MCPURL)
	}
	if profiles != nil {
		fmt.Fprintf(stdout, "  %-13s http://%s/debug/pprof/\n", "pprof", profiles)
	}
	if metricsAt != nil {
		fmt.Fprintf(stdout, "  %-13s http://%s/metrics\n", "metrics", metricsAt)
	}
	if *idf.insecure {
		fmt.Fprintln(stdout, "INSECURE: plaintext, peers not authenticated (--insecure-plaintext)")
	} else {
		fmt.Fprintf(stdout, "TLS: trust %s\n", filepath.Join(dev.Dir, "ca.crt"))
	}
	fmt.Fprintf(stdout, "tokens: v0m3 token --data-dir %s --subject <id> --groups <g1,g2>\n", *dataDir)
	fmt.Fprintln(stdout, "serving until interrupted (Ctrl-C)")
	<-ctx.Done()
	s.Close()
	return s.Err()
}

// mcpFlags configure the orchestrator's task MCP endpoint (issue 17).
type mcpFlags struct {
	addr, url, hosts, approval *string
	ttl                        *time.Duration
}

// addMCPFlags adds the task MCP endpoint's flags; addrNote, when set,
// describes the default of --mcp-addr.
func addMCPFlags(fs *flag.FlagSet, addrNote string) *mcpFlags {
	usage := "serve task-scoped MCP endpoints (/tasks/{task_id}/mcp) on this address, TLS with the orchestrator's certificate; empty = off"
	if addrNote != "" {
		usage = "serve task-scoped MCP endpoints (/tasks/{task_id}/mcp) on this address (" + addrNote + ")"
	}
	return &mcpFlags{
		addr:     fs.String("mcp-addr", "", usage),
		url:      fs.String("mcp-url", "", "base URL clients reach --mcp-addr at, handed out by StartTask (empty = https://<mcp-addr>)"),
		hosts:    fs.String("mcp-allowed-hosts", "", "comma-separated host names clients may use in Host and Origin besides loopback (others get 403, against DNS rebinding); the --mcp-url host is always allowed"),
		ttl:      fs.Duration("mcp-token-ttl", orchestrator.DefaultMCPTokenTTL, "how long a task MCP token lasts"),
		approval: fs.String("approval-url", "", "page where a person approves a request, with {request_id} in it (e.g. https://console.example/approvals/{request_id}): task MCP clients on 2026-07-28 are asked through URL elicitation to have a pending request approved there; empty = none"),
	}
}

// config is the suite's endpoint configuration; nil when off.
func (f *mcpFlags) config() *suite.MCP {
	if *f.addr == "" || *f.addr == "off" {
		return nil
	}
	m := &suite.MCP{Addr: *f.addr, BaseURL: *f.url, TokenTTL: *f.ttl, ApprovalURL: *f.approval}
	for _, h := range strings.Split(*f.hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			m.AllowedHosts = append(m.AllowedHosts, h)
		}
	}
	if u, err := url.Parse(*f.url); err == nil && u.Hostname() != "" {
		m.AllowedHosts = append(m.AllowedHosts, u.Hostname())
	}
	if h, _, err := net.SplitHostPort(*f.addr); err == nil && h != "" && h != "0.0.0.0" && h != "::" {
		m.AllowedHosts = append(m.AllowedHosts, h)
	}
	return m
}

// budgetFlags override the policy service's default task and requester
// budgets (the task budget is also the ceiling a profile's budget may
// reach), on `v0m3 policy` and `v0m3 dev`. `v0m3 bench` raises them so
// that a measurement is never refused for budget.
type budgetFlags struct{ task, requester policy.Limits }

func addBudgetFlags(fs *flag.FlagSet) *budgetFlags {
	b := &budgetFlags{}
	fs.Int64Var(&b.task.Calls, "task-budget-calls", 0, fmt.Sprintf("calls a task may make (0 = %d)", policy.DefaultTaskCalls))
	fs.Int64Var(&b.task.ResponseBytes, "task-budget-bytes", 0, fmt.Sprintf("response bytes a task may receive (0 = %d)", policy.DefaultTaskResponseBytes))
	fs.Int64Var(&b.task.CostMicros, "task-budget-cost", 0, fmt.Sprintf("cost in micros a task may spend (0 = %d)", policy.DefaultTaskCostMicros))
	fs.Int64Var(&b.requester.Calls, "requester-budget-calls", 0, fmt.Sprintf("calls a requester may make per period (0 = %d)", policy.DefaultRequesterCalls))
	fs.Int64Var(&b.requester.ResponseBytes, "requester-budget-bytes", 0, fmt.Sprintf("response bytes a requester may receive per period (0 = %d)", policy.DefaultRequesterResponseBytes))
	fs.Int64Var(&b.requester.CostMicros, "requester-budget-cost", 0, fmt.Sprintf("cost in micros a requester may spend per period (0 = %d)", policy.DefaultRequesterCostMicros))
	fs.DurationVar(&b.requester.Period, "requester-budget-period", 0, fmt.Sprintf("how long a requester's budget lasts before a fresh one starts, aligned to the Unix epoch (0 = %s: midnight to midnight UTC)", policy.DefaultRequesterPeriod))
	return b
}

// callerRateFlags say how fast a service admits one caller's requests
// (identity.RateLimits), on `v0m3 <service>` and `v0m3 dev`.
type callerRateFlags struct {
	perSecond *float64
	burst     *int
	groups    *string
}

func addCallerRateFlags(fs *flag.FlagSet) *callerRateFlags {
	d := identity.DefaultRateLimits
	return &callerRateFlags{
		perSecond: fs.Float64("caller-rate", d.Default.PerSecond, "requests a second each product or admin caller may make to this server, sustained; over it a request is refused with RESOURCE_EXHAUSTED, CALLER_RATE_LIMITED and a RetryInfo (0 = no limit; peer services are never limited)"),
		burst:     fs.Int("caller-burst", d.Default.Burst, "requests one caller may make at once, above --caller-rate, after a quiet spell"),
		groups:    fs.String("caller-rate-groups", formatGroupRates(d.Groups), "comma-separated GROUP=RATE:BURST giving the callers of a group their own limit instead of --caller-rate (the most generous of a caller's groups; RATE 0 = no limit); empty = none"),
	}
}

// limits reads the flags; a malformed value is a usage error.
func (f *callerRateFlags) limits() (identity.RateLimits, error) {
	def, err := checkRate("--caller-rate/--caller-burst", *f.perSecond, *f.burst)
	if err != nil {
		return identity.RateLimits{}, err
	}
	ls := identity.RateLimits{Default: def, Groups: map[string]identity.RateLimit{}}
	for _, item := range strings.Split(*f.groups, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		group, spec, ok := strings.Cut(item, "=")
		rateText, burstText, hasBurst := strings.Cut(spec, ":")
		perSecond, rerr := strconv.ParseFloat(rateText, 64)
		burst, berr := strconv.Atoi(burstText)
		if !hasBurst && rerr == nil && perSecond == 0 {
			burst, berr = 0, nil // "group=0": no limit, no burst to give
		}
		if !ok || group == "" || rerr != nil || berr != nil {
			return identity.RateLimits{}, usageError{fmt.Sprintf("--caller-rate-groups: %q is not GROUP=RATE:BURST (e.g. product-services=1000:2000, or product-services=0 for no limit)", item)}
		}
		if ls.Groups[group], err = checkRate("--caller-rate-groups "+group, perSecond, burst); err != nil {
			return identity.RateLimits{}, err
		}
	}
	return ls, nil
}

// checkRate refuses a negative or non-finite rate and, with a rate, a
// burst below one.
func checkRate(what string, perSecond float64, burst int) (identity.RateLimit, error) {
	switch {
	case perSecond < 0 || math.IsNaN(perSecond) || math.IsInf(perSecond, 0):
		return identity.RateLimit{}, usageError{what + ": the rate must be a number >= 0 (0 = no limit)"}
	case perSecond > 0 && burst < 1:
		return identity.RateLimit{}, usageError{what + ": the burst must be at least 1"}
	}
	return identity.RateLimit{PerSecond: perSecond, Burst: burst}, nil
}

// formatGroupRates is the --caller-rate-groups form of groups, sorted.
func formatGroupRates(groups map[string]identity.RateLimit) string {
	var out []string
	for _, g := range slices.Sorted(maps.Keys(groups)) {
		out = append(out, fmt.Sprintf("%s=%s:%d", g, strconv.FormatFloat(groups[g].PerSecond, 'g', -1, 64), groups[g].Burst))
	}
	return strings.Join(out, ",")
}

// addPprofFlag adds --pprof: where to serve runtime profiles, off unless
// given.
func addPprofFlag(fs *flag.FlagSet) *string {
	return fs.String("pprof", "", "serve Go runtime profiles (/debug/pprof/) on this loopback address, e.g. 127.0.0.1:6060; empty = off")
}

// startPprof serves runtime profiles on addr when it is set, and returns
// where (nil when off).
func startPprof(ctx context.Context, addr string, log *slog.Logger) (net.Addr, error) {
	if addr == "" {
		return nil, nil
	}
	a, err := serve.Profiling(ctx, addr, log)
	if err != nil {
		return nil, usageError{err.Error()}
	}
	return a, nil
}

// addMetricsFlag adds --metrics-addr: where to serve Prometheus metrics,
// a port of its own beside the gRPC one; off unless given.
func addMetricsFlag(fs *flag.FlagSet) *string {
	return fs.String("metrics-addr", "", "serve Prometheus metrics (/metrics) on this address, e.g. :9090; empty = off")
}

// startTelemetry serves metrics on addr (when set) and installs the
// tracer provider (OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set).
// It returns where metrics are served (nil when off) and a func that
// flushes buffered spans.
func startTelemetry(ctx context.Context, service, addr string, log *slog.Logger) (net.Addr, func(), error) {
	at, err := serve.Metrics(ctx, addr, log)
	if err != nil {
		return nil, nil, usageError{err.Error()}
	}
	shutdown, err := telemetry.Setup(ctx, service)
	if err != nil {
		return nil, nil, err
	}
	return at, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("flush traces", "err", err)
		}
	}, nil
}

// addInternalCallTimeoutFlag adds --internal-call-timeout: the bound on
// each call one service makes to another.
func addInternalCallTimeoutFlag(fs *flag.FlagSet) *time.Duration {
	return fs.Duration("internal-call-timeout", suite.DefaultInternalCallTimeout,
		"bound on each call one service makes to another (a caller's sooner deadline stays; the adapter's Execute is bounded by the attempt timeout)")
}
