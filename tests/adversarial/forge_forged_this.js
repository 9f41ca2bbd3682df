// Call tool functions with forged receivers and through every calling convention. The tool is
// bound by the host, not by `this`, so each call still reaches `echo`; the denied tool stays denied.
const out = {};
out.call = await tools.echo.call({name: "secret"}, {via: "call"});
out.apply = await tools.echo.apply(tools.secret, [{via: "apply"}]);
out.reflect = await Reflect.apply(tools.echo, tools.secret, [{via: "reflect"}]);
out.bound = await tools.echo.bind(tools.secret)({via: "bind"});
out.newed = await new tools.echo({via: "new"});
out.callCall = await Function.prototype.call.call(tools.echo, tools.secret, {via: "call.call"});
const refused = [];
const attempts = [
  () => tools.secret({}),
  () => tools["sec" + "ret"]({}),
  () => Object.getOwnPropertyDescriptor(tools, "secret").value.call(tools.echo, {}),
  () => Reflect.apply(tools.secret, tools.echo, [{}]),
  () => tools.secret.bind(tools.echo)({}),
];
for (const attempt of attempts) {
  try { await attempt(); refused.push("ran"); } catch (e) { refused.push(e instanceof ToolError ? e.tool + ": " + e.message : "other " + e); }
}
out.refused = refused;
// An undeclared name is a function too, whose call rejects with a ToolError naming it.
try { await tools.nonexistent({}); out.unknown = "ran"; } catch (e) { out.unknown = e.name + ": " + e.tool; }
return out;
