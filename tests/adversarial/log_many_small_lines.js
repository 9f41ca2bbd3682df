// 200000 tiny lines.
for (let i = 0; i < 200000; i++) console.log(i);
return "done";
