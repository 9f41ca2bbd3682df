JSON.stringify = () => { throw new Error("stringify hijacked"); };
JSON.parse = () => ({ forged: true });
const a = await tools.echo({x: 1});
const b = await tools.add({x: 1, y: 1});
console.log("logged", {k: "v"});
return {a, b};
