// eval and new Function are allowed; they see the same tools and gain nothing more.
const r1 = eval("tools.add({x: 1, y: 1})");
const f = new Function("t", "return t.add({x: 2, y: 2})");
const r2 = f(tools);
const r3 = (0, eval)("typeof tools + ':' + typeof ToolError + ':' + typeof bridge");
return [await r1, await r2, r3];
