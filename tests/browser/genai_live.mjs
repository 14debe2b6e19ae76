// One turn with @google/genai, unmodified, against the server's Live API
// endpoint: node genai_live.mjs BASE_URL KEY MODEL TEXT
// Prints one JSON line: what the model said, how much reply audio came, and
// how the socket closed (code and reason) if it closed before the turn's end.
// Trust for a private CA comes from NODE_EXTRA_CA_CERTS, as for any Node app.
import { GoogleGenAI, Modality } from "@google/genai";

const [baseUrl, apiKey, model, text] = process.argv.slice(2);
const ai = new GoogleGenAI({ apiKey, httpOptions: { baseUrl, apiVersion: "v1beta" } });

const result = { said: "", audioBytes: 0, setupComplete: false, turnComplete: false, close: null };
let done;
const finished = new Promise((resolve) => (done = resolve));
const timer = setTimeout(() => done(), 10000);

try {
  const session = await ai.live.connect({
    model,
    config: { responseModalities: [Modality.AUDIO], outputAudioTranscription: {} },
    callbacks: {
      onmessage: (message) => {
        if (message.setupComplete) result.setupComplete = true;
        const content = message.serverContent;
        if (content?.outputTranscription?.text) result.said += content.outputTranscription.text;
        for (const part of content?.modelTurn?.parts ?? []) {
          if (part.inlineData?.data) result.audioBytes += Buffer.from(part.inlineData.data, "base64").length;
        }
        if (content?.turnComplete) {
          result.turnComplete = true;
          done();
        }
      },
      onclose: (event) => {
        if (!result.turnComplete) result.close = { code: event.code, reason: event.reason };
        done();
      },
      onerror: () => {},
    },
  });
  session.sendRealtimeInput({ text });
  await finished;
  session.close();
} catch (error) {
  result.error = String(error);
}
clearTimeout(timer);
console.log(JSON.stringify(result));
process.exit(0);
