// Overwrite tools, console, ToolError in sloppy mode: silently ignored, and tools still work.
const r = [];
try { tools = null; r.push("tools assign ignored"); } catch (e) { r.push("tools threw " + e.name); }
try { console = null; r.push("console assign ignored"); } catch (e) { r.push("console threw " + e.name); }
try { ToolError = null; r.push("ToolError assign ignored"); } catch (e) { r.push("ToolError threw " + e.name); }
try { tools.echo = () => "fake"; } catch (e) { r.push("echo threw " + e.name); }
try { delete tools.echo; } catch (e) { r.push("delete threw " + e.name); }
try { tools.newTool = () => 1; } catch (e) { r.push("add threw " + e.name); }
try { Object.defineProperty(globalThis, "tools", {value: {}}); } catch (e) { r.push("redefine threw " + e.name); }
try { console.log = () => {}; } catch (e) { r.push("console.log threw " + e.name); }
try { Object.setPrototypeOf(tools, {evil: 1}); } catch (e) { r.push("setPrototypeOf threw " + e.name); }
try { ToolError.prototype.name = "Hacked"; } catch (e) { r.push("proto threw " + e.name); }
r.push(await tools.echo({still: "works"}));
console.log("still logging");
let err; try { await tools.fail({message: "m"}); } catch (e) { err = e instanceof ToolError && e.name; }
r.push(err, "newTool" in tools, Object.isFrozen(tools), Object.isFrozen(tools.echo));
return r;
