// Try to install a stack-trace hook after the prelude locked it: through a
// subclass's static, by assignment, and by redefining the property.
const seen = [];
class E extends Error { static prepareStackTrace(e, cs) { seen.push("hook ran"); return cs.map((c) => c.getFunction()); } }
seen.push(typeof new E("x").stack);
try { Error.prepareStackTrace = () => "x"; } catch (e) { seen.push("assign threw " + e.name); }
try { Object.defineProperty(Error, "prepareStackTrace", { get() { return () => 1; } }); } catch (e) { seen.push("redefine threw " + e.name); }
try { null.x; } catch (e) { seen.push(typeof e.stack); }
return seen;
