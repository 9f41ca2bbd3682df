// One 10 MB line: it must be cut, and the cut must be marked.
console.log("y".repeat(10 * 1024 * 1024));
return "done";
