"use strict";
// The same in strict mode: every overwrite throws a TypeError, and tools still work.
const r = [];
try { tools = null; r.push("assigned"); } catch (e) { r.push("tools threw " + e.name); }
try { console = null; r.push("assigned"); } catch (e) { r.push("console threw " + e.name); }
try { ToolError = null; r.push("assigned"); } catch (e) { r.push("ToolError threw " + e.name); }
try { tools.echo = 1; } catch (e) { r.push("echo threw " + e.name); }
try { delete tools.add; } catch (e) { r.push("delete threw " + e.name); }
try { console.log = 1; } catch (e) { r.push("log threw " + e.name); }
r.push(await tools.add({x: 4, y: 5}));
return r;
