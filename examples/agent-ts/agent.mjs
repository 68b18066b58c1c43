// An MCP agent pointed at one V0M3 task: it connects to the task's MCP
// endpoint with the task's token, lists the tools the task was offered,
// calls one and prints what came back, text and resource links.
//
// It stands in for a model: it fills each handle field with the first
// handle the tool's schema offers (handles are opaque choices titled with
// their labels; the agent never sees a URI) and takes the other arguments
// from V0M3_TOOL_ARGS (JSON, default {"query":"migration"}).
//
//   npm ci                                      # once: the pinned SDK, from package-lock.json
//   source "${TMPDIR:-/tmp}/v0m3-walkthrough-$(id -u)/agent.env"   # written by scripts/walkthrough.sh
//   V0M3_TLS_CA_FILE=../../.v0m3-data/pki/ca.crt node agent.mjs
//
// Environment: V0M3_MCP_URL and V0M3_MCP_TOKEN (from StartTask with
// mcp_access, or MintMcpToken), V0M3_TLS_CA_FILE (the CA `v0m3 dev` made,
// or set NODE_EXTRA_CA_CERTS to it yourself), V0M3_TOOL (default: the first tool
// offered), V0M3_TOOL_ARGS.
import { spawnSync } from "node:child_process";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const env = process.env;

// Node reads extra CAs only at start, from one file: run again with
// NODE_EXTRA_CA_CERTS naming the V0M3 CA (Node's own CAs stay trusted).
if (env.V0M3_TLS_CA_FILE && env.NODE_EXTRA_CA_CERTS !== env.V0M3_TLS_CA_FILE) {
  const r = spawnSync(process.execPath, process.argv.slice(1), {
    stdio: "inherit",
    env: { ...env, NODE_EXTRA_CA_CERTS: env.V0M3_TLS_CA_FILE },
  });
  process.exit(r.status ?? 1);
}

function fail(message) {
  console.error(`agent-ts: ${message}`);
  process.exit(1);
}

const url = env.V0M3_MCP_URL;
const token = env.V0M3_MCP_TOKEN;
if (!url || !token) {
  fail("the task's endpoint is needed: V0M3_MCP_URL and V0M3_MCP_TOKEN, from StartTask with mcp_access");
}
let args;
try {
  args = JSON.parse(env.V0M3_TOOL_ARGS || '{"query":"migration"}');
} catch (e) {
  fail(`V0M3_TOOL_ARGS: ${e.message}`);
}

// The endpoint is stateless: every request carries the task token.
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "v0m3-example-agent-ts", version: "1" });
try {
  await client.connect(transport);
} catch (e) {
  fail(`connect to ${url}: ${e.message}`);
}
const server = client.getServerVersion();
console.log(`connected to ${server?.name} (protocol ${transport.protocolVersion ?? "negotiated"})`);

const { tools } = await client.listTools();
for (const t of tools) {
  console.log(`tool: ${t.name}: ${t.description}`);
}
const tool = tools.find((t) => !env.V0M3_TOOL || t.name === env.V0M3_TOOL);
if (!tool) {
  fail(`the task offers no tool ${JSON.stringify(env.V0M3_TOOL)}`);
}

// What a model would pick from its catalogue: the first handle offered
// for each handle field the call does not set.
for (const [field, prop] of Object.entries(tool.inputSchema.properties ?? {})) {
  if (!(field in args) && Array.isArray(prop.oneOf) && prop.oneOf.length > 0) {
    args[field] = prop.oneOf[0].const;
  }
}

const result = await client.callTool({ name: tool.name, arguments: args });
console.log(`called ${tool.name} (error: ${Boolean(result.isError)})`);
for (const c of result.content ?? []) {
  if (c.type === "text") {
    console.log(`text: ${c.text}`);
  } else if (c.type === "resource_link") {
    console.log(`resource link: ${c.uri} (${c.name})`);
  } else {
    console.log(`content: ${JSON.stringify(c)}`);
  }
}
await client.close();
if (result.isError) {
  fail("the call was refused (the text says why and what to do)");
}
