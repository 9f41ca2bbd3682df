// Failure is data. A failed tool call rejects with a ToolError that carries
// exactly two strings, `tool` and `message`; the program catches it and goes on.
// Run it from the repository root with: nous-sched run examples/errors.js --tools examples/tools.py
const wanted = ["Lisbon", "Atlantis", "Nairobi"];
const found = [];
const missing = [];
for (const name of wanted) {
  try {
    const city = await tools.lookup_city({ name });
    found.push(city.name);
  } catch (e) {
    if (!(e instanceof ToolError)) throw e;
    console.log(`skipping ${name}: ${e.tool} failed`);
    missing.push(name);
  }
}

// Promise.allSettled keeps going past a refusal too.
const reads = await Promise.allSettled([
  tools.read_file({ path: "travel.txt" }),
  tools.read_file({ path: "../../setup.cfg" }),
]);
for (const r of reads) {
  if (r.status === "rejected") console.log(`refused: ${r.reason.message}`);
}

return { found, missing, reads: reads.map((r) => r.status) };
