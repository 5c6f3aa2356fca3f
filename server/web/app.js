// The page's whole logic: fill the model picker from /models, send /translate, show what came
// back. No framework and nothing from a CDN, so the page works where the server does.
"use strict";

const $ = (id) => document.getElementById(id);
let models = [];

function describe(model) {
  const facts = [model.variant.preset, model.precision || "float32"];
  facts.push(model.length_aware ? "plans lengths" : "no length encoding");
  facts.push(`inputs up to ${model.limits.max_input_tokens} subwords`);
  if (model.domains && model.domains.length) facts.push(`trained on ${model.domains.join("; ")}`);
  return facts.join(" · ");
}

function selectedModel() {
  return models.find((m) => m.name === $("model").value);
}

function showModel() {
  const model = selectedModel();
  $("model-info").textContent = model ? describe(model) : "";
  // A model without a length encoding can only force a length.
  if (model && !model.length_aware) $("mode").value = "exact";
}

async function loadModels() {
  const response = await fetch("/models");
  const body = await response.json();
  models = body.models;
  for (const model of models) {
    const option = document.createElement("option");
    option.value = model.name;
    option.textContent = model.name + (model.default ? " (default)" : "");
    option.selected = model.default;
    $("model").append(option);
  }
  showModel();
}

function requestBody(texts) {
  const body = { text: texts, model: $("model").value };
  const length = document.querySelector("input[name=length]:checked").value;
  if (length === "tokens") body.target_length = Number($("tokens").value);
  if (length === "source") body.target_length = "source";
  if (length === "chars") body.max_chars = Number($("chars").value);
  if (length === "about") body.target_chars = Number($("about").value);
  if (length === "isometric") body.target_chars = "source";
  if (length !== "none") body.length_mode = $("mode").value;
  return body;
}

function line(className, text) {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = text;
  return div;
}

function lengthFacts(t) {
  const facts = [`${t.source_tokens} → ${t.output_tokens} subwords`, `${t.text.length} characters`];
  if (t.target_length !== undefined) {
    facts.push(`target ${t.target_length} (${t.length_source}, ${t.length_mode})`);
  }
  if (t.predicted_length !== undefined) facts.push(`predicted ${t.predicted_length.toFixed(1)}`);
  if (t.truncated) facts.push("cut at a word boundary");
  if (t.length_candidates) {
    const tried = t.length_candidates.map((c) => `${c.target_length}→${c.characters}${c.chosen ? "*" : ""}`);
    facts.push(`candidates (subwords→characters) ${tried.join(", ")}`);
  }
  return facts.join(" · ");
}

function showTranslations(texts, body, millis) {
  const results = $("results");
  results.replaceChildren();
  body.translations.forEach((t, i) => {
    const card = document.createElement("article");
    card.className = "translation";
    card.append(line("source", texts[i]), line("target", t.text), line("facts", lengthFacts(t)));
    results.append(card);
  });
  $("status").textContent = `${body.model} · ${millis.toFixed(0)} ms`;
}

function showError(status, body) {
  const message = body && body.error ? `${body.error_type}: ${body.error}` : `HTTP ${status}`;
  $("results").replaceChildren(line("error", message));
  $("status").textContent = "";
}

async function translate(event) {
  event.preventDefault();
  const texts = $("text").value.split("\n").map((s) => s.trim()).filter((s) => s.length > 0);
  if (texts.length === 0) return;
  $("submit").disabled = true;
  $("status").textContent = "translating…";
  const started = performance.now();
  try {
    const response = await fetch("/translate", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(requestBody(texts)),
    });
    const body = await response.json().catch(() => null);
    if (response.ok) showTranslations(texts, body, performance.now() - started);
    else showError(response.status, body);
  } catch (e) {
    showError(0, { error: String(e), error_type: "network" });
  } finally {
    $("submit").disabled = false;
  }
}

// `/?text=...` fills the box and translates at once: a link can share a translation.
function translateFromLink() {
  const text = new URLSearchParams(window.location.search).get("text");
  if (text) {
    $("text").value = text;
    $("form").requestSubmit();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("form").addEventListener("submit", translate);
  $("model").addEventListener("change", showModel);
  loadModels()
    .then(translateFromLink)
    .catch((e) => showError(0, { error: String(e), error_type: "network" }));
});
