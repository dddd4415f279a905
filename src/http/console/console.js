// The console's one script: follows a PROCESSING record live (the Watch
// feed as Server-Sent Events) and counts its lease down. Every page works
// without it. It writes text only (textContent), never markup.
"use strict";

function countdown() {
  const el = document.getElementById("countdown");
  if (!el) return;
  const expires = Number(el.dataset.expires);
  const tick = () => {
    const left = Math.round((expires - Date.now()) / 1000);
    el.textContent = left > 0 ? "(in " + left + " s)" : "(run out)";
  };
  tick();
  setInterval(tick, 1000);
}

function follow() {
  const section = document.getElementById("record");
  if (!section || section.dataset.status !== "PROCESSING" || !window.EventSource) return;
  const status = document.getElementById("status");
  const live = document.getElementById("live");
  const source = new EventSource(section.dataset.watch);
  live.textContent = " (following live)";
  source.onmessage = (event) => {
    let record;
    try {
      record = JSON.parse(event.data).record || {};
    } catch (e) {
      return;
    }
    const name = String(record.status || "").replace(/^STATUS_/, "");
    if (!name) return;
    status.textContent = name;
    section.dataset.status = name;
    if (name !== "PROCESSING") {
      source.close();
      live.textContent = " (changed: reloading)";
      window.location.reload();
    }
  };
  source.addEventListener("error", () => {
    live.textContent = " (reconnecting)";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  countdown();
  follow();
});
