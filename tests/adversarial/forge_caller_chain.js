// Walk `.caller` from sloppy program functions the prelude invokes (a toJSON
// during argument serialisation, a getter during console.log formatting),
// looking for the prelude's own functions.
var found = [];
function probe() {
  try {
    var c = probe.caller;
    for (var d = 0; c && d < 10; d++) { found.push(String(c.name)); c = c.caller; }
  } catch (e) { found.push("threw " + e.name); }
  return {};
}
await tools.echo({ toJSON: probe });
console.log({ get a() { try { found.push(String(Object.getOwnPropertyDescriptor(this, "a").get.caller)); } catch (e) { found.push("threw " + e.name); } return 1; } });
return found;
