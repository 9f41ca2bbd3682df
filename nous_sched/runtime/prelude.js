// The in-sandbox half of the bridge. Evaluated once per run, before the
// program, as one expression whose value (the `bridge` function) goes only to
// the host: no global names it, so a program cannot call it to settle its own
// calls, drain the outbox or fake its result.
//
// It takes nothing from the run, so a worker process can evaluate it in a fresh
// context before the run exists: the run's tool names and limits come once,
// through the bridge's "configure", before the program is compiled.
//
// Everything here uses intrinsics captured before the program runs, and
// null-prototype records, so a program that pollutes Object.prototype,
// Array.prototype, JSON or Promise changes only what it sees itself, never
// what crosses to the host.
(function () {
  "use strict";
  const JSONstringify = JSON.stringify;
  const JSONparse = JSON.parse;
  const create = Object.create;
  const freeze = Object.freeze;
  const defineProperty = Object.defineProperty;
  const apply = Reflect.apply;
  const PromiseCtor = Promise;
  const promiseThen = Promise.prototype.then;
  const promiseReject = Promise.reject;
  const strSlice = String.prototype.slice;
  const StringCtor = String;
  const ErrorCtor = Error;
  const getPrototypeOf = Object.getPrototypeOf;
  const AsyncFunctionPrototype = getPrototypeOf(async function () {});
  const strSplit = String.prototype.split;
  const strIndexOf = String.prototype.indexOf;

  // quickjs-ng implements V8's Error.prepareStackTrace: an accessor that stores
  // one hook per context, set through *any* error constructor, whose CallSites
  // hand out every frame's function, the bridge's included. Replace it with a
  // locked undefined before the program exists, so no hook can ever be set.
  defineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, configurable: false });

  // Set once by configure(); until then every call and log line is refused.
  let configured = false;
  let MAX_LOG_UNITS = 0;
  let MAX_OUTPUT_UNITS = 0;
  let MAX_ARGS_UNITS = 0;

  let nextId = 0;
  const outbox = create(null);
  let outHead = 0;
  let outTail = 0;
  const waiting = create(null);
  let logs = create(null);
  let logCount = 0;
  let logUnits = 0;
  let logDropped = 0;
  let mainJson = "null";

  class ToolError extends ErrorCtor {
    constructor(tool, message) {
      super(message);
      defineProperty(this, "tool", { value: tool, enumerable: true });
    }
  }
  defineProperty(ToolError.prototype, "name", { value: "ToolError" });

  function describe(e) {
    try {
      if (e !== null && (typeof e === "object" || typeof e === "function")) {
        const message = e.message;
        if (typeof message === "string") {
          const name = e.name;
          let text = (typeof name === "string" && name ? name : "Error") + ": " + message;
          const stack = e.stack;
          if (!(e instanceof ToolError) && typeof stack === "string" && stack) text += "\n" + programFrames(stack);
          return text;
        }
        const json = JSONstringify(e);
        return "Uncaught " + (json === undefined ? "object" : json);
      }
      if (typeof e === "string") return "Uncaught " + JSONstringify(e);
      return "Uncaught " + StringCtor(e) + (typeof e === "bigint" ? "n" : "");
    } catch (_) {
      return "Uncaught exception (its value could not be described)";
    }
  }

  // The bridge's own frames (named __nous_*) are noise to the program's author.
  function programFrames(stack) {
    const lines = apply(strSplit, stack, ["\n"]);
    let out = "";
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      if (line === "" || apply(strIndexOf, line, ["__nous_"]) !== -1) continue;
      out += (out ? "\n" : "") + line;
    }
    return out;
  }

  function brief(e) {
    try {
      return StringCtor(e.name) + ": " + StringCtor(e.message);
    } catch (_) {
      return "(an exception that could not be described)";
    }
  }

  function call(name, args) {
    let json;
    try {
      json = JSONstringify(args === undefined ? null : args);
    } catch (e) {
      return apply(promiseReject, PromiseCtor, [new ToolError(name, "arguments are not JSON: " + brief(e))]);
    }
    if (json !== undefined && json.length > MAX_ARGS_UNITS) {
      // Refused here, before anything crosses: the host never parses it.
      return apply(promiseReject, PromiseCtor, [
        new ToolError(name, "arguments are " + json.length + " characters of JSON, over the run's limit of " + MAX_ARGS_UNITS),
      ]);
    }
    const id = ++nextId;
    outbox[outTail++] = [id, name, json === undefined ? "null" : json];
    return new PromiseCtor(function (res, rej) {
      waiting[id] = { res: res, rej: rej };
    });
  }

  function __nous_settle(id, ok, payload) {
    const w = waiting[id];
    if (w === undefined) return;
    delete waiting[id];
    const value = JSONparse(payload);
    if (ok) w.res(value);
    else w.rej(new ToolError(value.tool, value.message));
  }

  function format(args) {
    let line = "";
    for (let i = 0; i < args.length; i++) {
      const v = args[i];
      let text;
      if (typeof v === "string") text = v;
      else if (v instanceof ErrorCtor) text = describe(v);
      else {
        try {
          text = JSONstringify(v);
        } catch (_) {
          text = undefined;
        }
        if (text === undefined) {
          try {
            text = StringCtor(v);
          } catch (_) {
            text = "[unprintable]";
          }
        }
      }
      line += (i ? " " : "") + text;
    }
    return line;
  }

  function emit(prefix, args) {
    if (logUnits >= MAX_LOG_UNITS) {
      logDropped++;
      return;
    }
    let line = prefix + format(args);
    if (logUnits + line.length > MAX_LOG_UNITS) {
      line = apply(strSlice, line, [0, MAX_LOG_UNITS - logUnits]);
      logDropped++; // a cut line counts as lost, so the host adds the marker
    }
    logUnits += line.length;
    logs[logCount++] = line;
  }

  function drain() {
    let out = '{"calls":[';
    for (let first = true; outHead < outTail; first = false) {
      const c = outbox[outHead];
      delete outbox[outHead++];
      out += (first ? "[" : ",[") + c[0] + "," + JSONstringify(c[1]) + "," + c[2] + "]";
    }
    out += '],"logs":[';
    for (let i = 0; i < logCount; i++) out += (i ? "," : "") + JSONstringify(logs[i]);
    logs = create(null);
    logCount = 0;
    // The program's result crosses once: the host keeps it from the first
    // envelope that carries it, however many calls are still outstanding.
    out += '],"dropped":' + logDropped + ',"main":' + mainJson + "}";
    mainJson = "null";
    // Concatenation builds a rope string, which the binding cannot convert: flatten it.
    return apply(strSlice, out, [0]);
  }

  function onFulfilled(v) {
    const kind = typeof v;
    if (kind === "function" || kind === "symbol") {
      mainJson = '{"state":"invalid","error":' + JSONstringify("the program returned a " + kind + ", which has no JSON form") + "}";
      return;
    }
    let json;
    try {
      json = JSONstringify(v === undefined ? null : v);
    } catch (e) {
      mainJson = '{"state":"invalid","error":' + JSONstringify("the program's result has no JSON form: " + brief(e)) + "}";
      return;
    }
    if (json === undefined) json = "null";
    if (json.length > MAX_OUTPUT_UNITS) {
      mainJson = '{"state":"output_limit","size":' + json.length + "}";
      return;
    }
    mainJson = '{"state":"fulfilled","value":' + json + "}";
  }

  function onRejected(e) {
    mainJson = '{"state":"rejected","error":' + JSONstringify(describe(e)) + "}";
  }

  function __nous_start(main) {
    // The host wraps the program as `(async function program() {<code>\n})`;
    // anything else means the code closed that function early.
    if (typeof main !== "function" || getPrototypeOf(main) !== AsyncFunctionPrototype) {
      onRejected(new SyntaxError("unbalanced braces: the program closes the function it runs in"));
      return;
    }
    apply(promiseThen, main(), [onFulfilled, onRejected]);
  }

  function makeTool(name) {
    return freeze(function (args) {
      return call(name, args);
    });
  }

  const tools = create(null);

  // namesJson: a JSON array of tool names; limitsJson: [log, output, args] units.
  function configure(namesJson, limitsJson) {
    if (configured) return;
    configured = true;
    const names = JSONparse(namesJson);
    const limits = JSONparse(limitsJson);
    MAX_LOG_UNITS = limits[0];
    MAX_OUTPUT_UNITS = limits[1];
    MAX_ARGS_UNITS = limits[2];
    for (let i = 0; i < names.length; i++) {
      defineProperty(tools, names[i], { value: makeTool(names[i]), enumerable: true });
    }
    freeze(tools);
  }
  const logger = function (prefix) {
    return freeze(function () {
      emit(prefix, arguments);
    });
  };
  const consoleObject = freeze({
    log: logger(""),
    info: logger(""),
    debug: logger(""),
    warn: logger("[warn] "),
    error: logger("[error] "),
  });
  freeze(ToolError.prototype);
  freeze(ToolError);
  defineProperty(globalThis, "tools", { value: tools });
  defineProperty(globalThis, "console", { value: consoleObject });
  defineProperty(globalThis, "ToolError", { value: ToolError });

  return function __nous_bridge(op, a, b, c) {
    if (op === "drain") return drain();
    if (op === "settle") return __nous_settle(a, b, c);
    if (op === "start") return __nous_start(a);
    if (op === "configure") return configure(a, b);
    return undefined;
  };
})()
