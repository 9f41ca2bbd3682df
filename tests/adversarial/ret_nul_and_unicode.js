console.log("a\u0000b", "é€😀");
return ["a\u0000b", "é€😀", "\u2028\u2029"];
