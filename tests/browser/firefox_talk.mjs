// Talks to the demo page in Debian's Firefox ESR, driven over WebDriver BiDi.
//
//   node firefox_talk.mjs PAGE_URL REPLY_SAMPLES
//
// Opens the page, presses "Start talking" (the microphone is the system's
// default source: the test points PULSE_SERVER at a private PulseAudio whose
// default source it feeds), and prints one JSON line per step on stdout:
// {"step": "listening", ...} once the session is open and the microphone live,
// then {"step": "played", ...} once REPLY_SAMPLES of reply audio have played
// and the page is listening again, with the page's stats and transcript.
// Exits non-zero with {"step": "failed", "error": ...} on any failure.

import puppeteer from "puppeteer-core";

const [url, replySamples = "0"] = process.argv.slice(2);
const say = (step, data = {}) => process.stdout.write(JSON.stringify({ step, ...data }) + "\n");

const FIREFOX = process.env.FIREFOX || "/usr/bin/firefox-esr";

async function snapshot(page) {
  return page.evaluate(() => ({
    state: document.getElementById("state").textContent,
    stats: window.live ? window.live.stats() : null,
    you: [...document.querySelectorAll("#log li[data-side=you] .text")].map((e) => e.textContent),
    agent: [...document.querySelectorAll("#log li[data-side=agent] .text")].map((e) => e.textContent),
    errors: [...document.querySelectorAll("#log li.error")].map((e) => e.textContent),
    userAgent: navigator.userAgent,
  }));
}

let browser;
let page;
let stage = "launching Firefox";
const pageErrors = [];
// Every step below has its own timeout but one: a bound on the whole run, saying where it stuck.
const watchdog = setTimeout(() => {
  say("failed", { error: `stuck for 100 s while ${stage}`, pageErrors });
  process.exit(1);
}, 100000);
const at = (what) => {
  stage = what;
  process.stderr.write(`${new Date().toISOString()} ${what}\n`);
};
try {
  at("launching Firefox");
  browser = await puppeteer.launch({
    browser: "firefox",
    executablePath: FIREFOX,
    headless: true,
    extraPrefsFirefox: {
      "media.navigator.permission.disabled": true, // no permission prompt
      "media.autoplay.default": 0,
      "media.autoplay.block-webaudio": false,
    },
  });
  at("opening a tab");
  page = await browser.newPage();
  page.on("pageerror", (error) => pageErrors.push(String(error)));
  at("loading the page");
  await page.goto(url);
  at("pressing Start talking");
  await page.click("#talk");
  at("waiting for the session and the microphone");
  await page.waitForFunction(
    () => window.live && window.live.state.microphone && window.live.state.connection === "open",
    { timeout: 20000, polling: 50 },
  );
  say("listening", await snapshot(page));
  at("waiting for the reply to play");
  await page.waitForFunction(
    (n) => {
      const s = window.live.stats();
      return s.samplesPlayed >= n && !s.playing && document.getElementById("state").textContent === "Listening";
    },
    { timeout: 60000, polling: 50 },
    Number(replySamples),
  );
  say("played", { ...(await snapshot(page)), pageErrors });
  at("closing Firefox");
  await browser.close();
  clearTimeout(watchdog);
} catch (error) {
  let seen = null;
  try {
    if (page) seen = await snapshot(page);
  } catch {}
  say("failed", { error: String(error && error.stack ? error.stack : error), seen, pageErrors });
  if (browser) await browser.close().catch(() => {});
  process.exit(1);
}
