// The standard tool loop of the official OpenAI client (npm `openai`) against `blockspec serve`:
// node openai_client_tool_loop.cjs <node_modules dir> <port>
// The model's replies are whatever the tiny test model writes: the loop feeds the assistant's
// tool call back as a client does after a call (content null, arguments a JSON string), then the
// tool's result, and every turn must be answered (200). Prints "ok" and exits 0 when all pass.
const path = require("path");
const { OpenAI, NotFoundError } = require(path.join(process.argv[2], "openai"));

const client = new OpenAI({ baseURL: `http://127.0.0.1:${process.argv[3]}/v1`, apiKey: "unused", maxRetries: 0 });

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the current weather in a city.",
    parameters: {
      type: "object",
      properties: { city: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city"],
    },
  },
}];

function check(cond, what) {
  if (!cond) throw new Error("check failed: " + what);
}

async function main() {
  const models = await client.models.list();
  const model = models.data[0].id;
  const retrieved = await client.models.retrieve(model);
  check(retrieved.id === model && retrieved.object === "model", "models.retrieve(id)");
  let notFound = false;
  try {
    await client.models.retrieve("no-such-model");
  } catch (e) {
    notFound = e instanceof NotFoundError;
  }
  check(notFound, "models.retrieve of an unknown id is a NotFoundError");

  const messages = [
    { role: "system", content: "You are a helpful assistant." },
    { role: "user", content: "What is the weather in Paris?" },
  ];
  // Turn 1: the client appends the reply message as it came back.
  const first = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  check(first.choices[0].message.role === "assistant", "turn 1 reply");
  messages.push(first.choices[0].message);
  messages.push({ role: "user", content: "Use the tool, please." });
  // The assistant's tool call as the client holds it after a call (content null) and the result.
  messages.push({
    role: "assistant",
    content: null,
    tool_calls: [{ id: "call_0001", type: "function", function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris", unit: "celsius" }) } }],
  });
  messages.push({ role: "tool", tool_call_id: "call_0001", content: JSON.stringify({ temperature: 21, condition: "sunny" }) });
  // Turn 2, whole and streamed.
  const second = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  check(second.choices[0].message.role === "assistant", "turn 2 reply");
  check(second.usage.prompt_tokens > 0, "turn 2 usage");
  let streamed = "";
  const stream = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0, stream: true });
  for await (const chunk of stream) streamed += chunk.choices[0]?.delta?.content ?? "";
  check(streamed === (second.choices[0].message.content ?? ""), "turn 2 streamed equals whole");
  // Turn 3: the final answer goes back too, content given as parts.
  messages.push(second.choices[0].message);
  messages.push({ role: "user", content: [{ type: "text", text: "And tomorrow?" }] });
  const third = await client.chat.completions.create({ model, messages, tools, max_tokens: 8, temperature: 0 });
  check(third.choices[0].message.role === "assistant", "turn 3 reply");
  console.log("ok");
}

main().catch((e) => {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
});
