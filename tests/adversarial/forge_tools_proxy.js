// `tools` is a proxy that answers any name: probe it for a way to the bridge, to the
// handler, or to a tool that is not declared. Every probe must find only the declared tools.
const out = {};
out.keys = Object.keys(tools);
out.ownKeys = Reflect.ownKeys(tools).map(String);
out.json = JSON.stringify(tools);
out.has = ["echo" in tools, "nope" in tools, "then" in tools, Symbol.iterator in tools];
out.proto = Object.getPrototypeOf(tools);
out.frozen = [Object.isFrozen(tools), Object.isExtensible(tools)];
out.descriptor = Object.getOwnPropertyDescriptor(tools, "nope") === undefined;
out.protocol = [typeof tools.then, typeof tools.toJSON, typeof tools.constructor, typeof tools.valueOf,
                typeof tools[Symbol.toPrimitive], typeof tools.__proto__];
out.undeclared = typeof tools.nope;
out.sameEach = tools.nope === tools.nope; // a fresh function each read: nothing cached to tamper with
const attempts = [];
for (const [label, f] of [
  ["define", () => Object.defineProperty(tools, "nope", { value: () => 1 })],
  ["assign", () => { "use strict"; tools.nope = () => 1; }],
  ["setPrototypeOf", () => Object.setPrototypeOf(tools, {})],
  ["preventExtensions", () => Reflect.preventExtensions(tools) && "ok"],
]) {
  try { attempts.push(label + ": " + f()); } catch (e) { attempts.push(label + " threw " + e.name); }
}
out.attempts = attempts;
// Inheriting from tools passes the program's object as the receiver: the trap ignores it.
const child = Object.create(tools, { own: { value: 1 } });
out.child = [typeof child.echo, child.own, "nope" in child];
// The undeclared tool's function holds nothing: no properties, its prototype Function's.
const f = tools.nope;
out.fnOwn = Reflect.ownKeys(f).map(String).sort();
out.fnFrozen = Object.isFrozen(f);
// Calling it still goes through the host, which refuses it with a ToolError naming it.
try { await f.call({ name: "echo" }, {}); out.called = "ran"; } catch (e) { out.called = [e instanceof ToolError, e.tool]; }
try { await tools["e" + "cho "]({}); out.spaced = "ran"; } catch (e) { out.spaced = e.message.slice(0, 40); }
return out;
