// Function('return this')(), constructors reached from tools, eval of private names,
// caller/arguments walking: none of it yields anything that settles calls or drains the outbox.
const out = {};
const g = Function("return this")();
out.sameGlobal = g === globalThis;
out.toolCtorIsFunction = tools.echo.constructor === Function;
const AsyncFunction = (async function () {}).constructor;
const GeneratorFunction = (function* () {}).constructor;
out.asyncCtor = await AsyncFunction("return typeof tools")();
out.genCtor = GeneratorFunction("yield typeof console")().next().value;
out.privateNames = {};
for (const n of ["bridge", "__nous_bridge", "__nous_settle", "__nous_start", "call", "drain", "outbox",
                 "waiting", "emit", "mainJson", "NAMES", "JSONstringify", "settle"]) {
  try { out.privateNames[n] = typeof eval(n); } catch (e) { out.privateNames[n] = e.name; }
  try { out.privateNames[n] += "/" + typeof new Function("return typeof " + n)(); } catch (e) { out.privateNames[n] += "/" + e.name; }
}
const probes = {};
for (const [label, fn] of [["echo.caller", () => tools.echo.caller], ["echo.arguments", () => tools.echo.arguments],
                           ["log.caller", () => console.log.caller], ["ToolError.caller", () => ToolError.caller]]) {
  try { const v = fn(); probes[label] = v === null || v === undefined ? String(v) : typeof v; } catch (e) { probes[label] = e.name; }
}
out.probes = probes;
let callerSeen = "not called";
await tools.echo({ toJSON() {
  try { callerSeen = typeof arguments.callee.caller; } catch (e) { callerSeen = e.name; }
  return {};
} });
out.callerFromToJSON = callerSeen;
class Sub extends ToolError { constructor() { super("echo", "self-made"); } }
const mine = new Sub();
out.selfMadeToolError = [mine instanceof ToolError, mine.tool, mine.message];
return out;
