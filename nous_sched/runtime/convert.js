// The one rule for values with no faithful JSON form, for a program's result
// and the values it logs (documented in nous_sched/result/_hints.py, which turns the
// notes into the answer's hint): Map -> object (string keys) or [key, value]
// pairs, Set -> array, Date -> ISO string, typed array / ArrayBuffer -> array
// of numbers, BigInt -> decimal string, NaN/Infinity -> null, undefined ->
// null in an array and dropped from an object, function/symbol/Promise ->
// null in an array and dropped from an object, a reference back to an
// enclosing value (a cycle) -> null, any other class instance -> its own
// fields (an Error: its name and message). Each conversion is noted with its
// path ($ is the value itself).
//
// Compiled by the prelude (prelude.js, loadConverter) the first time a value
// needs it (or a call's arguments may hold a Promise: promiseAt), after the
// program may have changed every global: it uses only
// the intrinsics it is handed, captured before the program ran.
(function (I) {
  "use strict";
  const { getPrototypeOf, isArray, objectKeys, defineProperty, create, apply, strSlice, StringCtor, ErrorCtor } = I;
  const { JSONstringify, mapEntries, setValues, mapIterNext, setIterNext, dateISO, dateTime, isView, U8 } = I;
  const { ABProto, MapProto, SetProto, DateProto, ObjectProto, PromiseProto, numberIsFinite, isRawJSON } = I;
  const { charCodeAt, own, MAX_NOTES, NOTE_UNITS } = I;
  // (A loop, not a regular expression: cheaper to compile.)
  function isIdentifier(key) {
    if (key.length === 0) return false;
    for (let i = 0; i < key.length; i++) {
      const c = apply(charCodeAt, key, [i]);
      const letter = (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95 || c === 36;
      if (!letter && !(i > 0 && c >= 48 && c <= 57)) return false;
    }
    return true;
  }
  own(isIdentifier);
  function pathKey(path, key) {
    return isIdentifier(key) ? path + "." + key : path + "[" + JSONstringify(key) + "]";
  }

  function note(notes, path, what) {
    notes.count++;
    if (notes.list.length < MAX_NOTES) put(notes.list, notes.list.length, apply(strSlice, path + ": " + what, [0, NOTE_UNITS]));
  }
  // Set with a null-prototype descriptor: a program that sets
  // Object.prototype.get cannot make it an accessor's.
  const DATA = create(null);
  DATA.enumerable = true;
  DATA.writable = true;
  DATA.configurable = true;
  function put(out, key, value) {
    DATA.value = value;
    defineProperty(out, key, DATA);
    DATA.value = undefined;
  }
  // `DROP` marks a value that has no place in an object (its key goes).
  const DROP = create(null);
  function plain(v, path, notes, stack) {
    const kind = typeof v;
    if (kind === "string" || kind === "boolean" || v === null) return v;
    if (kind === "number") {
      if (numberIsFinite(v)) return v;
      note(notes, path, StringCtor(v) + ", sent as null");
      return null;
    }
    if (kind === "bigint") {
      note(notes, path, "a BigInt, sent as a decimal string");
      return StringCtor(v);
    }
    if (kind === "undefined") return DROP;
    if (kind === "function" || kind === "symbol") {
      note(notes, path, "a " + kind + ", which has no JSON form, dropped");
      return DROP;
    }
    for (let i = 0; i < stack.length; i++) {
      if (stack[i] === v) {
        note(notes, path, "a reference back to an enclosing value (a cycle), sent as null");
        return null;
      }
    }
    const proto = getPrototypeOf(v);
    if (proto === PromiseProto) {
      note(notes, path, "a Promise, dropped: a call whose result was not awaited (write `await` before it)");
      return DROP;
    }
    put(stack, stack.length, v);
    try {
      return plainObject(v, proto, path, notes, stack);
    } finally {
      stack.length--;
    }
  }
  function plainObject(v, proto, path, notes, stack) {
    if (isArray(v)) {
      const out = [];
      for (let i = 0; i < v.length; i++) {
        const item = plain(v[i], path + "[" + i + "]", notes, stack);
        if (item === DROP) {
          if (v[i] === undefined) note(notes, path + "[" + i + "]", "undefined, sent as null");
          put(out, i, null);
        } else put(out, i, item);
      }
      return out;
    }
    if (proto === MapProto) return plainMap(v, path, notes, stack);
    if (proto === SetProto) {
      note(notes, path, "a Set, sent as an array");
      const out = [];
      const it = apply(setValues, v, []);
      for (let r = apply(setIterNext, it, []), i = 0; !r.done; r = apply(setIterNext, it, []), i++) {
        const item = plain(r.value, path + "[" + i + "]", notes, stack);
        put(out, i, item === DROP ? null : item);
      }
      return out;
    }
    if (proto === DateProto) {
      const t = apply(dateTime, v, []);
      if (!numberIsFinite(t)) {
        note(notes, path, "an invalid Date, sent as null");
        return null;
      }
      note(notes, path, "a Date, sent as its ISO string");
      return apply(dateISO, v, []);
    }
    if (isView(v) || proto === ABProto) {
      const bytes = proto === ABProto ? new U8(v) : v;
      note(notes, path, (proto === ABProto ? "an ArrayBuffer" : "a typed array") + ", sent as an array of numbers");
      const out = [];
      if (typeof bytes.length !== "number") return out;
      for (let i = 0; i < bytes.length; i++) put(out, i, plain(bytes[i], path + "[" + i + "]", notes, stack));
      return out;
    }
    if (isRawJSON !== undefined && isRawJSON(v)) return v; // JSON.rawJSON: its text, as JSON.stringify writes it
    if (typeof v.toJSON === "function") return plain(v.toJSON(), path, notes, stack);
    if (proto !== ObjectProto && proto !== null) {
      let name = "a class instance";
      try {
        const ctor = proto.constructor;
        if (typeof ctor === "function" && typeof ctor.name === "string" && ctor.name) name = "an instance of " + ctor.name;
      } catch (_) {}
      if (v instanceof ErrorCtor) {
        note(notes, path, name + ", sent as its name and message");
        return { name: StringCtor(v.name), message: StringCtor(v.message) };
      }
      note(notes, path, name + ", sent as its own fields");
    }
    const out = {};
    const keys = objectKeys(v);
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i];
      const item = plain(v[key], pathKey(path, key), notes, stack);
      if (item === DROP) {
        if (v[key] === undefined) note(notes, pathKey(path, key), "undefined, dropped");
      } else put(out, key, item);
    }
    return out;
  }
  function plainMap(v, path, notes, stack) {
    const entries = [];
    let strings = true;
    const it = apply(mapEntries, v, []);
    for (let r = apply(mapIterNext, it, []); !r.done; r = apply(mapIterNext, it, [])) {
      entries[entries.length] = r.value;
      if (typeof r.value[0] !== "string") strings = false;
    }
    if (strings) {
      note(notes, path, "a Map, sent as an object");
      const out = {};
      for (let i = 0; i < entries.length; i++) {
        const key = entries[i][0];
        const item = plain(entries[i][1], pathKey(path, key), notes, stack);
        if (item !== DROP) put(out, key, item);
      }
      return out;
    }
    note(notes, path, "a Map with keys that are not strings, sent as a list of [key, value] pairs");
    const out = [];
    for (let i = 0; i < entries.length; i++) {
      const key = plain(entries[i][0], path + "[" + i + "][0]", notes, stack);
      const item = plain(entries[i][1], path + "[" + i + "][1]", notes, stack);
      const pair = [];
      put(pair, 0, key === DROP ? null : key);
      put(pair, 1, item === DROP ? null : item);
      put(out, i, pair);
    }
    return out;
  }
  // The value as JSON text by the rule above, and its notes ({count, list}).
  function toJSONText(v, notes) {
    const value = plain(v, "$", notes, []);
    return value === DROP ? undefined : JSONstringify(value);
  }
  own(plain);
  own(plainObject);
  own(plainMap);
  own(note);
  own(toJSONText);
  // The first Promise in a call's arguments (a call whose result was not awaited): its path, or null.
  function promiseAt(v, path, depth) {
    if (v === null || typeof v !== "object" || depth > 32) return null;
    const proto = getPrototypeOf(v);
    if (proto === PromiseProto) return path;
    if (isArray(v)) return promiseInItems(v, path, depth);
    if (proto !== ObjectProto && proto !== null) return null;
    return promiseInKeys(v, objectKeys(v), path, depth);
  }
  // promiseAt's look inside an array `v`, and inside a plain object `v` whose keys are `keys`
  // (the prelude looks at a call's arguments themselves: see its promiseInArgs).
  function promiseInItems(v, path, depth) {
    for (let i = 0; i < v.length; i++) {
      const at = promiseAt(v[i], path + "[" + i + "]", depth + 1);
      if (at !== null) return at;
    }
    return null;
  }
  function promiseInKeys(v, keys, path, depth) {
    for (let i = 0; i < keys.length; i++) {
      const at = promiseAt(v[keys[i]], pathKey(path, keys[i]), depth + 1);
      if (at !== null) return at;
    }
    return null;
  }
  own(promiseAt);
  own(promiseInItems);
  own(promiseInKeys);
  return { toJSONText, promiseAt, promiseInItems, promiseInKeys };
})
