// 10 MB of logs in 1000-character lines.
const chunk = "x".repeat(1000);
for (let i = 0; i < 10000; i++) console.log(chunk);
return "done";
