// console.log of a value whose toJSON never returns.
console.log("first line");
console.log({ toJSON() { for (;;) {} } });
return "unreachable";
