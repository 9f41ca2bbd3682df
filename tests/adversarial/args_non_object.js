// Every non-object argument shape. Non-objects are refused by the host; values JSON cannot
// spell (functions, symbols, undefined, NaN) serialise to null, which means "no arguments".
const out = [];
const cyc = {}; cyc.cyc = cyc;
const cases = [5, "str", [1, 2], true, () => 1, Symbol("s"), 10n, cyc, null, undefined, NaN,
               {a: undefined, b: () => 2, c: NaN}, new Date(0), "x".repeat(300)];
for (const c of cases) {
  try { out.push(["ok", await tools.echo(c)]); }
  catch (e) { out.push(["err", e instanceof ToolError, e.tool, e.message]); }
}
return out;
