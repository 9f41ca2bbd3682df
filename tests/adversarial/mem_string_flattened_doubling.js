// Double a string and force it flat each time, so the bytes are really allocated.
let s = "xxxxxxxx";
while (true) { s = s + s; s.charCodeAt(s.length - 1); s = s.split("").join(""); }
