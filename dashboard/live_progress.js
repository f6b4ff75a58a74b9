// swapkl's live progress line (a Streamlit components.v2 component; see dashboard/live_view.py `live`).
// Polls the running job's small progress file (`data.url`, served from the app's static folder) and redraws
// only this bar -- no Streamlit script run, so following a job costs the server and this page nothing.
// When the job has something new for this page (the parts in `data.watch` changed -- the first result at once,
// then at most every `min_redraw_ms`) or has ended, it sends one trigger, and that rerun draws the new results.
export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  // Streamlit may call this function again for the same element when a rerun sends new data: one poller per
  // job, or every earlier poller would go on triggering reruns of its own (each a full redraw).
  const reg = (globalThis.__swapklLive = globalThis.__swapklLive || {});
  if (reg[data.url]) reg[data.url]();
  parentElement.querySelectorAll(".swapkl-live").forEach((e) => e.remove());
  const root = document.createElement("div");
  root.className = "swapkl-live";
  root.innerHTML = '<div class="bar"><div class="fill"></div></div><div class="txt"></div>';
  parentElement.appendChild(root);
  const fill = root.querySelector(".fill");
  const txt = root.querySelector(".txt");
  let drawn = data.drawn;
  const seen = (p) => data.watch.reduce((a, w) => a + ((p.updates || {})[w] || 0), 0);
  let last = Date.now();
  let step = (data.progress || {}).step;
  let empty = !!data.empty;  // nothing drawn yet: the first result is drawn at once
  let stopped = false;
  let timer = null;
  const show = (p) => {
    fill.style.width = (100 * Math.max(0, Math.min(1, p.fraction || 0))).toFixed(1) + "%";
    txt.textContent = p.text || "";
  };
  show(data.progress);
  const tick = async () => {
    if (stopped) return;
    try {
      const r = await fetch(data.url + "?t=" + Date.now(), { cache: "no-store" });
      if (r.ok) {
        const p = await r.json();
        show(p);
        const now = Date.now();
        const v = seen(p);
        // redraw: the job ended; or something new for this page and (it is the first, a step of the job
        // ended -- e.g. every adjacent pair is scored --, or min_redraw_ms passed since the last redraw)
        const stepEnded = p.step !== step;
        step = p.step;
        if (p.finished || (v !== drawn && (empty || stepEnded || now - last >= data.min_redraw_ms))) {
          drawn = v;
          last = now;
          empty = false;
          setTriggerValue("redraw", v);
          if (p.finished) { stopped = true; return; }
        }
      }
    } catch (e) { /* the server restarts or the file is being replaced: try again */ }
    timer = setTimeout(tick, data.poll_ms);
  };
  const stop = () => { stopped = true; if (timer) clearTimeout(timer); };
  reg[data.url] = stop;
  timer = setTimeout(tick, data.poll_ms);
  return () => { stop(); if (reg[data.url] === stop) delete reg[data.url]; root.remove(); };
}
