// Safe reads and exclusive writes in one program.
// Run it from the repository root with: nous-sched run examples/notes.js --tools examples/tools.py
// read_file, word_count, search_files, lookup_city and list_notes are
// concurrency-safe and fan out. add_note has no concurrency_safe predicate, so
// it is exclusive: it waits until every earlier call has committed, runs
// alone, and commits before any later call starts. In the trail of the last
// batch, the two lookups before the note overlap, the note runs by itself,
// and the calls after it start only once it has committed.
const doc = await tools.read_file({ path: "travel.txt" });
const [count, hits] = await Promise.all([
  tools.word_count({ text: doc.text }),
  tools.search_files({ query: "trip" }),
]);
console.log(`travel.txt: ${count.words} words; ${hits.matches.length} lines mention a trip`);

const line = (name) => doc.text.split("\n").find((l) => l.includes(name));
const [lisbon, osaka, note, nairobi, notes] = await Promise.all([
  tools.lookup_city({ name: "Lisbon" }),
  tools.lookup_city({ name: "Osaka" }),
  tools.add_note({ title: "spring trip", text: [line("Lisbon"), line("Osaka"), line("Nairobi")].join("\n") }),
  tools.lookup_city({ name: "Nairobi" }),
  tools.list_notes({}),
]);
console.log(`saved note ${note.id}: ${note.title}`);

return {
  words: count.words,
  trip_lines: hits.matches.length,
  stops: [lisbon, osaka, nairobi].map((c) => `${c.name}, ${c.country}`),
  notes: notes.map((n) => n.title),
};
