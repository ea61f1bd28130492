// The console's entry: asks for the admin token (kept in sessionStorage, for this tab only),
// then shows the page the URL's fragment names: #/overview, #/clients, #/clients/<ClientId>,
// #/topics, #/access.

import { api, forgetToken, saveToken, savedToken, whenUnauthorized } from "./api.js";
import * as access from "./access.js";
import * as clients from "./clients.js";
import * as overview from "./overview.js";
import * as topics from "./topics.js";

const view = document.getElementById("view");
const login = document.getElementById("login");
const nav = document.getElementById("nav");
const forget = document.getElementById("forget");
const tokenInput = document.getElementById("token");
const loginError = document.getElementById("login-error");
let leave = null; // stops the current page's refreshing

const ROUTES = [
  [/^#\/overview$/, "overview", (root) => overview.render(root)],
  [/^#\/clients$/, "clients", (root) => clients.renderSearch(root)],
  [/^#\/clients\/(.+)$/, "clients", (root, id) => clients.renderClient(root, decodeURIComponent(id))],
  [/^#\/topics$/, "topics", (root) => topics.render(root)],
  [/^#\/access$/, "access", (root) => access.render(root)],
];

function showLogin(message) {
  if (leave) leave();
  leave = null;
  view.replaceChildren();
  nav.hidden = true;
  forget.hidden = true;
  login.hidden = false;
  loginError.textContent = message || "";
  tokenInput.value = "";
  tokenInput.focus();
}

function route() {
  if (!savedToken()) {
    showLogin();
    return;
  }
  login.hidden = true;
  nav.hidden = false;
  forget.hidden = false;
  if (leave) leave();
  leave = null;
  const hash = location.hash || "#/overview";
  for (const [pattern, section, render] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    for (const link of nav.querySelectorAll("a")) {
      link.classList.toggle("active", link.dataset.section === section);
    }
    const root = document.createElement("div");
    root.dataset.page = section;
    view.replaceChildren(root);
    leave = render(root, ...match.slice(1)) || null;
    return;
  }
  location.hash = "#/overview";
}

tokenInput.addEventListener("keydown", async (event) => {
  if (event.key !== "Enter") return;
  event.preventDefault();
  const token = tokenInput.value.trim();
  if (!token) return;
  try {
    await api("GET", "/stats", { token }); // checks the token before keeping it
  } catch (exc) {
    loginError.textContent = exc.status === 401 ? "This token is refused." : exc.message;
    tokenInput.value = "";
    return;
  }
  saveToken(token);
  tokenInput.value = "";
  route();
});

forget.addEventListener("click", () => {
  forgetToken();
  showLogin("Token forgotten.");
});

whenUnauthorized(() => {
  forgetToken();
  showLogin("The node refused the token (changed?): enter it again.");
});

window.addEventListener("hashchange", route);
route();
