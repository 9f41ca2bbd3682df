// Walk everything reachable from globalThis (own keys incl. symbols and non-enumerables,
// accessor functions, prototypes) looking for anything that could settle calls or drain the
// outbox. Report bridge-like names and every non-native (JS-defined) function found.
const seen = new Set();
const queue = [[globalThis, "globalThis"]];
const suspicious = [];
const jsFunctions = [];
const toSource = Function.prototype.toString;
const isNative = (f) => { try { return /\[native code\]/.test(toSource.call(f)); } catch (e) { return true; } };
const BAD = /nous|bridge|^settle$|drain|outbox|waiting|^emit$|onFulfilled|onRejected|^call$|^start$/i;
while (queue.length) {
  const [o, path] = queue.shift();
  if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) continue;
  seen.add(o);
  if (typeof o === "function") {
    if (BAD.test(String(o.name)) && !isNative(o)) suspicious.push(path + " named " + o.name);
    if (!isNative(o)) jsFunctions.push(path);
  }
  let keys = [];
  try { keys = Reflect.ownKeys(o); } catch (e) {}
  for (const k of keys) {
    let d;
    try { d = Object.getOwnPropertyDescriptor(o, k); } catch (e) { continue; }
    if (!d) continue;
    const name = path + "." + String(k);
    if (/nous|bridge|outbox|waiting/i.test(String(k))) suspicious.push("key " + name);
    for (const v of [d.value, d.get, d.set]) if (v !== undefined) queue.push([v, name]);
  }
  let p;
  try { p = Object.getPrototypeOf(o); } catch (e) {}
  if (p) queue.push([p, path + ".__proto__"]);
}
const names = Object.getOwnPropertyNames(globalThis);
return {suspicious, jsFunctions: jsFunctions.sort(), hasTools: names.includes("tools"), walked: seen.size > 300};
