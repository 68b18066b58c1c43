// A real TypeScript SDK client (npm @modelcontextprotocol/sdk) reaching a
// V0M3 task's MCP endpoint: what an agent framework built on that SDK
// does. Run by TestTaskMCPTypeScriptClient with NODE_PATH pointing at the
// SDK and NODE_EXTRA_CA_CERTS at the development CA.
//
//   node taskmcp-client.cjs URL
//   env: V0M3_TASK_TOKEN  the task's bearer token
//        V0M3_CALL        JSON {"name": ..., "arguments": {...}} to call
//
// It prints one JSON line: the negotiated protocol version, the listed
// tools and the call's result.
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

async function main() {
  const url = new URL(process.argv[process.argv.length - 1]);
  const transport = new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: "Bearer " + process.env.V0M3_TASK_TOKEN } },
  });
  const client = new Client({ name: "v0m3-ts-agent", version: "1.0.0" });
  await client.connect(transport);
  const tools = await client.listTools();
  const call = JSON.parse(process.env.V0M3_CALL);
  const result = await client.callTool(call);
  process.stdout.write(JSON.stringify({
    protocolVersion: transport.protocolVersion,
    tools: tools.tools,
    result,
  }) + "\n");
  await client.close();
}

main().catch((err) => {
  process.stderr.write("taskmcp-client: " + (err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});
