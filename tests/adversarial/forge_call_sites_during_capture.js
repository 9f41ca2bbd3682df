// Every tool call captures its call site through the engine's stack-trace machinery, whose
// CallSites hold every frame's function. Try to be the one handed them: an accessor on
// Error.stackTraceLimit and on Error.captureStackTrace, errors made while the call is being
// made (in toJSON), and captureStackTrace on the program's own objects.
const seen = [];
const realCapture = Error.captureStackTrace;
const record = (where) => {
  const e = new Error(where);
  seen.push(where + ":" + typeof e.stack + ":" + Array.isArray(e.stack));
  const o = {};
  try { realCapture(o); seen.push(where + " capture:" + typeof o.stack); } catch (x) { seen.push(where + " capture threw " + x.name); }
};
try {
  Object.defineProperty(Error, "stackTraceLimit", { get() { record("limit getter"); return 10; }, set(v) {}, configurable: true });
} catch (e) { seen.push("stackTraceLimit threw " + e.name); }
try {
  Error.captureStackTrace = function (o) { record("capture replaced"); return realCapture(o); };
} catch (e) { seen.push("captureStackTrace threw " + e.name); }
await tools.echo({ toJSON() { record("toJSON"); return {}; } });
try { await tools.nope({ toJSON() { record("toJSON unknown"); return {}; } }); } catch (e) { seen.push("unknown: " + typeof e.stack); }
record("after");
return seen.filter((s) => !/:string:false$|capture:string$|unknown: string/.test(s));
