// The administrators' pages: users, permissions, policies, each a list with a delete button
// per row and a form to add or replace one. What a form sends is what RabbitMQ's API takes
// (docs/management.md); the API decides who may. Loaded before app.js, whose helpers
// (el, api, table, form, button, vhostSelect, jsonField, refreshNow) it uses when called.
"use strict";

async function usersLive() {
  const users = await api("GET", "/users");
  return [table([
    ["name", "Name", (u) => u.name],
    ["tags", "Tags", (u) => (u.tags || []).join(", ")],
    ["password", "Password", (u) => (u.password_hash
      ? (u.hashing_algorithm || "yes").replace("rabbit_password_hashing_", "") : "none")],
    ["delete", "", (u) => (u.password_hash ? button("Delete", async () => {
      if (!confirm(`Delete user ${u.name} and its permissions?`)) return;
      await api("DELETE", `/users/${enc(u.name)}`);
    }) : "")],
  ], users), el("p", { class: "hint" },
    "Users without a password are principals that log in with a token or a certificate " +
    "and have permissions, or are management administrators.")];
}

function userForm() {
  const output = el("output");
  const name = el("input", { name: "user_name", required: true, size: 24 });
  const password = el("input", { name: "user_password", type: "password", size: 24, autocomplete: "new-password" });
  const tags = el("input", { name: "user_tags", size: 30, placeholder: "administrator, management" });
  return form("Add or update a user", [
    el("label", {}, "Username ", name), el("label", {}, "Password ", password),
    el("label", {}, "Tags ", tags),
  ], "Add user", output, async () => {
    const body = { tags: tags.value };
    if (password.value) body.password = password.value;
    await api("PUT", `/users/${enc(name.value)}`, { body });
    output.textContent = `User ${name.value} saved.`;
    refreshNow();
  }, "A user saved without a password logs in only with a token or a certificate.");
}

async function permissionsLive() {
  const permissions = await api("GET", "/permissions");
  return [table([
    ["user", "User", (p) => p.user],
    ["vhost", "Virtual host", (p) => p.vhost],
    ["configure", "Configure", (p) => p.configure],
    ["write", "Write", (p) => p.write],
    ["read", "Read", (p) => p.read],
    ["clear", "", (p) => button("Clear", async () => {
      if (!confirm(`Clear ${p.user}'s permissions in ${p.vhost}?`)) return;
      await api("DELETE", `/permissions/${enc(p.vhost)}/${enc(p.user)}`);
    })],
  ], permissions)];
}

function permissionForm() {
  const output = el("output");
  const user = el("input", { name: "permission_user", required: true, size: 24 });
  const vhost = vhostSelect("permission_vhost");
  const pattern = (key) => el("input", { name: key, value: ".*", size: 12 });
  const [configure, write, read] = ["configure", "write", "read"].map(pattern);
  return form("Set permission", [
    el("label", {}, "User ", user), el("label", {}, "Virtual host ", vhost),
    el("label", {}, "Configure regexp ", configure), el("label", {}, "Write regexp ", write),
    el("label", {}, "Read regexp ", read),
  ], "Set permission", output, async () => {
    await api("PUT", `/permissions/${enc(vhost.value)}/${enc(user.value)}`, {
      body: { configure: configure.value, write: write.value, read: read.value },
    });
    output.textContent = `Permissions of ${user.value} in ${vhost.value} set.`;
    refreshNow();
  });
}

async function policiesLive() {
  const policies = await api("GET", "/policies");
  return [table([
    ["vhost", "Virtual host", (p) => p.vhost],
    ["name", "Name", (p) => p.name],
    ["pattern", "Pattern", (p) => p.pattern],
    ["apply_to", "Apply to", (p) => p["apply-to"]],
    ["definition", "Definition", (p) => json(p.definition)],
    ["priority", "Priority", (p) => p.priority],
    ["delete", "", (p) => button("Delete", async () => {
      if (!confirm(`Delete policy ${p.name}?`)) return;
      await api("DELETE", `/policies/${enc(p.vhost)}/${enc(p.name)}`);
    })],
  ], policies)];
}

function policyForm() {
  const output = el("output");
  const vhost = vhostSelect("policy_vhost");
  const name = el("input", { name: "policy_name", required: true, size: 20 });
  const pattern = el("input", { name: "policy_pattern", required: true, size: 20, placeholder: "^orders\\." });
  const applyTo = el("select", { name: "policy_apply_to" },
    ["queues", "exchanges", "all"].map((v) => el("option", { value: v }, v)));
  const priority = el("input", { name: "policy_priority", type: "number", value: 0, size: 4 });
  const definition = jsonField("policy_definition", '{"max-length": 1000}');
  return form("Add or update a policy", [
    el("label", {}, "Virtual host ", vhost), el("label", {}, "Name ", name),
    el("label", {}, "Pattern ", pattern), el("label", {}, "Apply to ", applyTo),
    el("label", {}, "Priority ", priority), el("label", {}, "Definition (JSON) ", definition),
  ], "Add policy", output, async () => {
    await api("PUT", `/policies/${enc(vhost.value)}/${enc(name.value)}`, {
      body: {
        pattern: pattern.value, "apply-to": applyTo.value, priority: Number(priority.value),
        definition: jsonValue(definition, "Definition"),
      },
    });
    output.textContent = `Policy ${name.value} saved.`;
    refreshNow();
  });
}
