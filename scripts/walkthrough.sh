#!/usr/bin/env bash
# Walk through V0M3 Boundary against a running `make run` (`v0m3 dev`):
# connect a server, review it, discover it, map a capability onto it, start
# a task, submit what a model asked for, approve it, read the result and
# the trace. Every id is captured from the answers, never pasted; each step
# prints one narrated line.
#
#   make run                    # in one terminal
#   scripts/walkthrough.sh      # in another
#
# Act 1 reads a source through the fixture "V0M3 Sources" server (a
# retrieval: no approval). Act 2 renders a preview through the fixture
# "V0M3 Renderer" (policy makes authors' previews wait for a person), so
# a request waits, is approved by someone else and then runs. At the end
# it leaves the URL and token of Act 1's task MCP endpoint in a file, for
# the agents in examples/ (see examples/README.md).
#
# Re-runnable against the same instance: connections and mappings it made
# before (found by name and command) are reused; tasks and requests are new
# each time.
#
# Environment (all optional; the defaults fit `make run`):
#   V0M3_BIN                 the v0m3 binary `v0m3 dev` runs (default <repo>/bin/v0m3);
#                            stdio servers are started from it, so it must be the same file
#   V0M3_DATA_DIR            `v0m3 dev`'s --data-dir (default <repo>/.v0m3-data), for tokens and the CA
#   V0M3_TLS_CA_FILE         CA to trust (default $V0M3_DATA_DIR/pki/ca.crt)
#   V0M3_ORCHESTRATOR_ADDR, V0M3_REGISTRY_ADDR, V0M3_EVIDENCE_ADDR, V0M3_ADAPTER_ADDR
#                            the services (default 127.0.0.1:7400, 7401, 7403, 7404)
#   V0M3_WALKTHROUGH_DIR     where the renderer's work directory and agent.env go
#                            (default ${TMPDIR:-/tmp}/v0m3-walkthrough-<uid>)
#   GRPCURL                  a grpcurl command (default: grpcurl on PATH, else `go tool grpcurl`)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
V0M3="${V0M3_BIN:-$repo/bin/v0m3}"
DATA="${V0M3_DATA_DIR:-$repo/.v0m3-data}"
CA="${V0M3_TLS_CA_FILE:-$DATA/pki/ca.crt}"
ORCH="${V0M3_ORCHESTRATOR_ADDR:-127.0.0.1:7400}"
REG="${V0M3_REGISTRY_ADDR:-127.0.0.1:7401}"
EVID="${V0M3_EVIDENCE_ADDR:-127.0.0.1:7403}"
ADAPT="${V0M3_ADAPTER_ADDR:-127.0.0.1:7404}"
WALK="${V0M3_WALKTHROUGH_DIR:-${TMPDIR:-/tmp}/v0m3-walkthrough-$(id -u)}"

die() {
  echo "walkthrough: $*" >&2
  exit 1
}
say() { printf '%s\n' "$*"; }

# --- what it needs ------------------------------------------------------------
command -v jq >/dev/null || die "jq is needed to read the answers (apt-get install jq)"
if [ -n "${GRPCURL:-}" ]; then
  read -r -a grpcurl <<<"$GRPCURL"
elif command -v grpcurl >/dev/null; then
  grpcurl=(grpcurl)
elif command -v go >/dev/null; then
  grpcurl=(go -C "$repo" tool grpcurl) # a tool dependency in go.mod: built once, cached
else
  die "grpcurl is needed: install it, or Go (the repository pins it: go tool grpcurl)"
fi
[ -x "$V0M3" ] || die "no v0m3 binary at $V0M3: run 'make build' (or set V0M3_BIN to the binary 'v0m3 dev' runs)"
V0M3="$(cd "$(dirname "$V0M3")" && pwd)/$(basename "$V0M3")"
[ -f "$CA" ] || die "no CA at $CA: is 'make run' (v0m3 dev --data-dir $DATA) running? Start it, or set V0M3_DATA_DIR to its --data-dir"
if ! out="$("${grpcurl[@]}" -cacert "$CA" -connect-timeout 5 -max-time 10 "$ORCH" grpc.health.v1.Health/Check 2>&1)"; then
  die "v0m3 dev is not reachable at $ORCH (trusting $CA): $out
Start it with 'make run' (or set V0M3_ORCHESTRATOR_ADDR and V0M3_DATA_DIR to the instance you run)."
fi

# call ADDR TOKEN METHOD [JSON]: the answer as JSON on stdout; a refusal
# ends the walkthrough with the status and reason grpcurl printed.
call() {
  local addr="$1" token="$2" method="$3" body="${4:-}" out
  local args=(-cacert "$CA" -max-time 60 -format-error -H "authorization: Bearer $token")
  [ -n "$body" ] && args+=(-d "$body")
  if ! out="$("${grpcurl[@]}" "${args[@]}" "$addr" "$method" 2>&1)"; then
    die "${method##*/} failed:
$out"
  fi
  printf '%s\n' "$out"
}

tok() { "$V0M3" token --data-dir "$DATA" --subject "$1" --groups "$2"; }
PLATFORM="$(tok integrator platform)" || die "cannot mint a development token from $DATA/pki: is this the data directory of the running 'v0m3 dev'?"
REVIEWER="$(tok reviewer reviewers)"
ALICE="$(tok alice authors)"
APPROVER="$(tok approver approvers)"
AUDITOR="$(tok auditor auditors)"

REGISTRY=v0m3.registry.v1.RegistryService
ORCHESTRATOR=v0m3.orchestrator.v1.OrchestratorService

# connect NAME ARGS_JSON: the id of an approved connection running
# `$V0M3 ARGS` over stdio, created and reviewed unless one exists.
connect() {
  local name="$1" args="$2" conn id rev state
  conn="$(call "$REG" "$PLATFORM" $REGISTRY/ListConnections '{"page_size":1000}' |
    jq -c --arg n "$name" --arg c "$V0M3" --argjson a "$args" \
      '[.connections[]? | select(.displayName == $n and .transport.stdio.command == $c and .transport.stdio.args == $a)] | last // empty')"
  if [ -z "$conn" ]; then
    conn="$(call "$REG" "$PLATFORM" $REGISTRY/CreateConnection "$(jq -nc --arg n "$name" --arg c "$V0M3" --argjson a "$args" \
      '{display_name: $n, owner: "platform-team", credential_scope: "local fixture; no credential", transport: {stdio: {command: $c, args: $a}}}')")"
    id="$(jq -r .id <<<"$conn")"
    say "  connect:  $name over stdio is $id, by integrator (platform), awaiting review: connecting registers nothing"
  else
    id="$(jq -r .id <<<"$conn")"
    say "  connect:  $name is already $id (reusing it)"
  fi
  rev="$(jq -r .configRevision <<<"$conn")"
  state="$(jq -r '.reviewState // ""' <<<"$conn")"
  if [ "$state" != REVIEW_STATE_APPROVED ]; then
    conn="$(call "$REG" "$REVIEWER" $REGISTRY/ReviewConnection "$(jq -nc --arg id "$id" --argjson r "$rev" '{connection_id: $id, config_revision: $r, approve: true}')")"
    say "  review:   reviewer (reviewers) approved $id at config revision $rev: only now may it be started"
  else
    say "  review:   $id is approved at config revision $rev"
  fi
  CONN="$id"
}

# discover: the snapshot of $CONN's tools, with digests.
discover() {
  local snap
  snap="$(call "$ADAPT" "$PLATFORM" v0m3.adapter.v1.AdapterService/Discover "$(jq -nc --arg id "$CONN" '{connection_id: $id}')")"
  SNAP="$(jq -r .id <<<"$snap")"
  say "  discover: snapshot $SNAP: $(jq -r '[.tools[]? | "\(.name) (schema \(.inputSchemaDigest // "" | .[0:19])…)"] | join(", ")' <<<"$snap")"
}

# map CAPABILITY PROPOSAL_JSON: the id of an active mapping of CAPABILITY
# on $CONN, proposed by the integrator and reviewed by the reviewer unless
# one is active already.
map() {
  local cap="$1" proposal="$2" m id
  id="$(call "$REG" "$PLATFORM" $REGISTRY/ListMappings "$(jq -nc --arg c "$cap" --arg id "$CONN" '{capability: $c, connection_id: $id, state: "MAPPING_STATE_ACTIVE"}')" |
    jq -r '.mappings[0].id // empty')"
  if [ -n "$id" ]; then
    say "  map:      $cap is already active as $id on $CONN (reusing it)"
    MAP="$id"
    return
  fi
  m="$(call "$REG" "$PLATFORM" $REGISTRY/ProposeMapping "$(jq -c --arg c "$cap" --arg id "$CONN" --arg s "$SNAP" \
    '. + {capability: $c, connection_id: $id, snapshot_id: $s}' <<<"$proposal")")"
  id="$(jq -r .id <<<"$m")"
  say "  map:      integrator proposed $id: $cap -> $(jq -r .target.name <<<"$proposal") at snapshot $SNAP"
  m="$(call "$REG" "$REVIEWER" $REGISTRY/ReviewMapping "$(jq -nc --arg id "$id" --argjson r "$(jq .revision <<<"$m")" '{mapping_id: $id, revision: $r, approve: true}')")"
  say "  review:   reviewer approved $id: it is $(jq -r .state <<<"$m")"
  MAP="$id"
}

# trace TASK REQUEST: the task's trace, both layers, one line per event;
# fails unless the request is in it.
trace() {
  local task="$1" req="$2" tr
  tr="$(call "$EVID" "$AUDITOR" v0m3.evidence.v1.EvidenceService/GetTrace "$(jq -nc --arg t "$task" '{task_id: $t}')")"
  say "  trace:    auditor (auditors) reads $task: $(jq '.events | length' <<<"$tr") events"
  jq -r '.events[] | "    #\(.sequence) " + ((if .product then
      "product  \(.product.kind | sub("PRODUCT_EVENT_KIND_"; "") | ascii_downcase) \(.product.capability // "") \(.product.requestId // "") \(.product.outcome // "")"
    else
      "protocol \(.protocol.method // "") \(.protocol.requestId // "") \(.protocol.outcome // "") \(.protocol.responseBytes // 0) bytes"
    end) | sub("\\s+$"; ""))' <<<"$tr"
  jq -e --arg r "$req" '[.events[] | (.product.requestId // .protocol.requestId // "")] | index($r)' <<<"$tr" >/dev/null ||
    die "the trace of $task does not name request $req"
}

mkdir -p "$WALK"
chmod 0755 "$WALK"

say "V0M3 walkthrough against $ORCH (data $DATA)"
say ""
say "Act 1: read a source, through the fixture V0M3 Sources server"
connect "V0M3 Sources (walkthrough)" '["fixture-server"]'
discover
map retrieve_authorized_source '{"target": {"kind": "REMOTE_KIND_TOOL", "name": "search"},
  "argument_map": [{"remote_field": "query", "product_field": "query"}, {"remote_field": "uri", "product_field": "source", "from_handle": true}],
  "limits": {"max_response_bytes": 65536, "max_items": 5, "allowed_media_types": ["text/markdown", "text/plain"]}}'
start="$(call "$ORCH" "$ALICE" $ORCHESTRATOR/StartTask '{"profile": "source_review", "mcp_access": true,
  "source_scope": [{"uri": "v0m3-sources://notes/migration-faq", "title": "Migration FAQ"}]}')"
TASK="$(jq -r .task.id <<<"$start")"
handle="$(jq -r '.catalogue.offered[] | select(.name == "retrieve_authorized_source") | .handles[0].handle' <<<"$start")"
[ -n "$handle" ] && [ "$handle" != null ] || die "task $TASK was not offered retrieve_authorized_source: $(jq -c .catalogue.considered <<<"$start")"
say "  start:    alice (authors) started $TASK (source_review); offered: $(jq -r '[.catalogue.offered[].name] | join(", ")' <<<"$start"), a handle for \"Migration FAQ\", never its URI"
req="$(call "$ORCH" "$ALICE" $ORCHESTRATOR/SubmitToolRequest "$(jq -nc --arg t "$TASK" --arg h "$handle" \
  '{task_id: $t, provider_call_id: "call-1", capability: "retrieve_authorized_source", arguments: {source: $h, query: "migration"}}')")"
REQ="$(jq -r .id <<<"$req")"
say "  submit:   the model asked to search it for \"migration\": request $REQ is $(jq -r .state <<<"$req") (a retrieval needs no approval)"
say "  result:   $(jq -r '(.excerpts // []) as $e | "\($e | length) quoted excerpts (evidence, never instructions), e.g. \"\([$e[] | .quotedText | select(startswith("#") | not)] | first // "" | gsub("\\s+"; " ") | .[0:72])…\" from observation \($e[0].observationId)"' <<<"$req")"
trace "$TASK" "$REQ"
(
  umask 077
  jq -r '.mcpEndpoint | "export V0M3_MCP_URL=\(.url)\nexport V0M3_MCP_TOKEN=\(.token)"' <<<"$start" >"$WALK/agent.env"
)
say "  agents:   $TASK's MCP endpoint is $(jq -r .mcpEndpoint.url <<<"$start"); its URL and token are in $WALK/agent.env"

say ""
say "Act 2: render a preview, which waits for a person, through the fixture V0M3 Renderer"
mkdir -p "$WALK/renderer"
chmod 0777 "$WALK/renderer" # the adapter may run the renderer under a uid of its own
connect "V0M3 Renderer (walkthrough)" "$(jq -nc --arg w "$WALK/renderer" '["fixture-renderer", "--transport", "stdio", "--work-dir", $w]')"
discover
map render_preview '{"target": {"kind": "REMOTE_KIND_TOOL", "name": "render"},
  "argument_map": [{"remote_field": "document_revision", "product_field": "document_revision"}, {"remote_field": "profile", "product_field": "profile"}],
  "limits": {"max_response_bytes": 65536, "max_items": 4, "allowed_media_types": ["text/plain"]},
  "idempotency_key_field": "request_id", "status_tool": "status"}'
start="$(call "$ORCH" "$ALICE" $ORCHESTRATOR/StartTask '{"profile": "preview", "purpose": "preview revision 31 before review"}')"
TASK="$(jq -r .task.id <<<"$start")"
say "  start:    alice started $TASK (preview); offered: $(jq -r '[.catalogue.offered[].name] | join(", ")' <<<"$start")"
req="$(call "$ORCH" "$ALICE" $ORCHESTRATOR/SubmitToolRequest "$(jq -nc --arg t "$TASK" \
  '{task_id: $t, provider_call_id: "call-1", capability: "render_preview", arguments: {document_revision: 31, profile: 4}, document_digest: "sha256:document-31"}')")"
REQ="$(jq -r .id <<<"$req")"
state="$(jq -r .state <<<"$req")"
[ "$state" = REQUEST_STATE_AWAITING_APPROVAL ] || die "request $REQ is $state, expected REQUEST_STATE_AWAITING_APPROVAL"
say "  submit:   request $REQ waits for a person: \"$(jq -r .summary <<<"$req")\""
req="$(call "$ORCH" "$APPROVER" $ORCHESTRATOR/Approve "$(jq -nc --arg r "$REQ" '{request_id: $r, document_digest: "sha256:document-31"}')")"
say "  approve:  approver (approvers, not alice: nobody approves their own request) approved it: $(jq -r .state <<<"$req")"
req="$(call "$ORCH" "$ALICE" $ORCHESTRATOR/GetRequest "$(jq -nc --arg r "$REQ" '{id: $r}')")"
state="$(jq -r .state <<<"$req")"
[ "$state" = REQUEST_STATE_EXECUTED ] || die "request $REQ is $state after approval, expected REQUEST_STATE_EXECUTED: $(jq -c . <<<"$req")"
say "  result:   alice reads $REQ: $state, outcome $(jq -r .outcome <<<"$req"), receipt $(jq -r .receiptId <<<"$req"), artifact $(jq -r .artifactDigest <<<"$req")"
trace "$TASK" "$REQ"
say ""
say "done: task $TASK, request $REQ"
