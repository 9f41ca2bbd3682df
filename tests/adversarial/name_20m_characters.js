// A tool name of 20,000,000 characters: before, the host searched it for
// close names (seconds of every thread, +876 MiB). It crosses cut, and the
// host refuses it before any lookup.
const name = "a".repeat(20_000_000);
try {
  await tools[name]({});
  return "called";
} catch (e) {
  return [e instanceof ToolError, e.tool.length, e.message];
}
