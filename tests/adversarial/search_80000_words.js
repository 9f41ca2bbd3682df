// One sdk.search of 80,000 distinct words: its cost was words x tools.
const words = [];
for (let i = 0; i < 80000; i++) words.push("w" + i);
const out = [];
try {
  await sdk.search(words.join(" "));
  out.push("answered");
} catch (e) {
  out.push(e.tool, e.message.slice(0, 83));
}
// A question of a sensible size is still answered.
out.push((await sdk.search("add numbers")).map((t) => t.name));
return out;
