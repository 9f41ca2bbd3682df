// A lone surrogate in every place a program can put a string: arguments (a
// value and a key), a tool name, log lines and the result. All of it is data:
// audited, logged and returned, never a dead worker or a lost audit line. (A
// raw lone surrogate in the program's own text: tests/test_edge.py.)
const lone = "\ud800";
console.log("log " + lone);
const echoed = await tools.echo({ s: lone, [lone]: 1 });
let refused;
try {
  await tools["no" + lone]({});
} catch (e) {
  refused = [e.tool, e.message.slice(0, 15)];
}
return [echoed, refused, lone.length];
