#!/usr/bin/env bash
# The chat REPL in a terminal (tmux types and reads the screen), on the trained
# model at temperature 0: Ctrl-C mid-reply returns to the prompt and the next
# question is answered; arrow-up recalls the last line; /help; a chat that
# overflows a small --ctx-size keeps going; Ctrl-C twice at the prompt leaves.
set -u
bin=${DSV3_BIN:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
m=$root/models/dsv3-mini
command -v tmux >/dev/null || { echo "FAIL: tmux is not installed (scripts/setup.sh installs it)"; exit 1; }
tmp=$(mktemp -d)
sock=$tmp/tmux.sock
trap 'tmux -S "$sock" kill-server 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
screen() { tmux -S "$sock" capture-pane -p -S -200; }
wait_for() { for _ in $(seq 1 150); do screen | grep -q -- "$1" && return 0; sleep 0.1; done; return 1; }
prompts() { screen | grep -c '^>>>'; }
wait_prompts() { for _ in $(seq 1 150); do [ "$(prompts)" -ge "$1" ] && return 0; sleep 0.1; done; return 1; }

start() { # flags...
  tmux -S "$sock" kill-server 2>/dev/null
  sock=$tmp/tmux$RANDOM.sock
  tmux -S "$sock" new-session -d -x 200 -y 60 "$bin generate -m $m -i --temp 0 -t 1 $*; echo EXITED \$?; sleep 60"
  wait_for '^>>>' || bad "no prompt ($*): $(screen)"
}

# a long reply stopped by Ctrl-C; the chat goes on
start -n 5000
wait_for 'commands: /help' && ok || bad "no banner: $(screen)"
tmux -S "$sock" send-keys 'Tell me a long story' Enter
sleep 1.5
tmux -S "$sock" send-keys C-c
wait_for '\[stopped\]' && ok || bad "Ctrl-C did not stop the reply: $(screen | tail -5)"
wait_prompts 2 && ok || bad "no prompt after Ctrl-C"
tmux -S "$sock" send-keys 'What is the capital of France?' Enter
answered() { screen | sed -n '/^>>> What is the capital of France?$/,$p' | sed 1d | grep -q '[a-z]'; }
for _ in $(seq 1 100); do answered && break; sleep 0.1; done
answered && ok || bad "no answer to the question after Ctrl-C: $(screen | tail -5)"
tmux -S "$sock" send-keys C-c # stops this reply too; what came is kept
wait_prompts 3 && ok || bad "no prompt after the second question"
# arrow-up recalls the last line
tmux -S "$sock" send-keys Up
wait_for '^>>> What is the capital of France?$' && ok || bad "arrow-up did not recall the last line: $(screen | tail -3)"
tmux -S "$sock" send-keys C-u '/help' Enter
wait_for '/save FILE' && ok || bad "/help: $(screen | tail -8)"
grep -q 'EXITED' <(screen) && bad "the REPL ended early: $(screen | tail -5)"
tmux -S "$sock" send-keys C-c
sleep 0.3
tmux -S "$sock" send-keys C-c
wait_for 'EXITED 0' && ok || bad "two Ctrl-C at the prompt did not leave cleanly: $(screen | tail -5)"

# a chat that overflows a 64-position context keeps going
start -n 16 -c 64
for q in 'Hi there' 'How are you' 'Tell me more' 'And then'; do
  n=$(prompts)
  tmux -S "$sock" send-keys "$q" Enter
  wait_prompts $((n + 1)) || break
done
[ "$(prompts)" -ge 5 ] && ok || bad "the chat got stuck: $(screen | tail -8)"
wait_for 'dropped the' && ok || bad "no message about dropped turns: $(screen | tail -8)"
screen | grep -q '^error' && bad "an error in the overflowing chat: $(screen | tail -8)"
tmux -S "$sock" send-keys C-d
wait_for 'EXITED 0' && ok || bad "Ctrl-D did not leave cleanly"

echo "cli repl: $pass passed, $fail failed"
[ $fail = 0 ]
