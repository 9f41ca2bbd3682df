// Runs programs with Vercel's @ai-sdk/code-mode for bench_vercel.py.
//
// One JSON request per stdin line: {js, calls, inflight} (inflight null: the
// package's default limits). One JSON reply per stdout line: {ms, result} or
// {error, code}. The time is taken here, around runCodeMode alone, as
// bench_vercel.py times run_code: the pipe to Python is outside both clocks.
import { createInterface } from 'node:readline';
import { experimental_runCodeMode as runCodeMode } from '@ai-sdk/code-mode';
import { jsonSchema, tool } from 'ai';

const input = jsonSchema({
  type: 'object',
  properties: { i: { type: 'number' } },
  required: ['i'],
});
const tools = {
  noop: tool({ description: 'Return i.', inputSchema: input, execute: async ({ i }) => i }),
  sleepy: tool({
    description: 'Wait 5 ms, return i.',
    inputSchema: input,
    execute: ({ i }) => new Promise((resolve) => setTimeout(() => resolve(i), 5)),
  }),
};

const reply = (value) => process.stdout.write(JSON.stringify(value) + '\n');

reply({ ready: process.version });
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const request = JSON.parse(line);
  const options =
    request.inflight == null
      ? undefined
      : {
          executionPolicy: {
            maxBridgeRequests: request.calls,
            maxInFlightBridgeRequests: request.inflight,
          },
        };
  const t0 = performance.now();
  try {
    const result = await runCodeMode({ js: request.js, tools, options });
    reply({ ms: performance.now() - t0, result });
  } catch (error) {
    reply({ error: `${error.name}: ${error.message}`, code: error.code ?? null });
  }
}
