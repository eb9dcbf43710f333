// Sign in: a viewer's (or operator's) token opens a session (docs/web-api.md); the cookie is
// HttpOnly, so the token leaves the page once it is posted.

import { login } from '../api.js';
import { h } from '../ui.js';

export async function render(root, params) {
  const next = params.next && params.next.startsWith('#/') ? params.next : '#/runs';
  const token = h('input', { type: 'password', id: 'kp-token', autocomplete: 'current-password', required: true, size: 48 });
  const msg = h('div', { class: 'kp-login-msg', role: 'alert' });
  const form = h('form', { class: 'kp-login' },
    h('h1', {}, 'Sign in to kprof'),
    h('label', { for: 'kp-token' }, 'Token (a viewer\'s or operator\'s, from the analyzer\'s --auth-tokens file)'),
    token, h('button', { type: 'submit' }, 'sign in'), msg);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    msg.textContent = '';
    try {
      await login(token.value.trim());
      token.value = '';
      location.hash = next;
    } catch (e) {
      msg.textContent = e.message;
    }
  });
  root.append(form);
  document.getElementById('kp-logout').hidden = true;
}
