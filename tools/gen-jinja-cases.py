#!/usr/bin/env python3
"""Write tests/data/tokenizer/jinja-cases.json: templates rendered by jinja2 configured exactly as
transformers' apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, loopcontrols, tojson without HTML escaping, raise_exception). tests/test_chat.c
checks that toasted's interpreter gives the same bytes. Cases with "error" must fail in both; the
value is a substring of toasted's message. Run: python3 tools/gen-jinja-cases.py (needs jinja2).
The templates are written for this test, in the style of common chat templates."""
import json
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


def env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    return e


MSGS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "hi <there> & \"you\""},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello!"},
    {"role": "user", "content": "Ünïcödé 🎉 ok?"},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 3}},
                         "required": ["city"]}}}]
TOOL_MSGS = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}]},
    {"role": "tool", "content": "{\"temp\": 21.5}"},
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "21.5 and sunny.", "reasoning_content": "read the tool output"},
    {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image"}, {"type": "text", "text": " London?"}]},
]

CASES = [
    # whitespace control
    ("a\n{% if true %}\n  b\n{% endif %}\nc\n", {}),
    ("  {% if true %}x{% endif %}  \n  {%- if true -%}  y  {%- endif %}\n{{ 'z' }}", {}),
    ("{% for i in [1,2] %}\n    {{ i }}\n{% endfor %}\n", {}),
    ("a  {%+ if true %}b{% endif +%}\nc{# note #}\nd  {#- x -#}  e\n\n", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}\n{{ '{{' }}", {}),
    ("line\r\nwindows\r\n{{- ' x' }}\r\n", {}),
    ("{{ 'a' }}\n{{ 'b' -}}\n  \n{{ 'c' }}", {}),
    # literals and printing
    ("{{ 1 }} {{ -3 }} {{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ 1.5e-7 }} {{ 3.14159 }} {{ 2.5e15 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }}", {}),
    ("{{ true }} {{ false }} {{ none }} {{ True }} {{ None }}", {}),
    ("{{ [1, 'a', none, true, 2.5] }} {{ {'k': 'v', 'n': [1]} }} {{ (1, 2) }} {{ \"it's\" }} {{ ['it\\'s', 'say \"x\"'] }}", {}),
    ("{{ 'tab\\tnew\\nline\\\\ \\u00e9 \\x41' }}|{{ ['a\\nb'] }}", {}),
    ("{{ missing }}[{{ missing_too }}]{{ d.nokey }}{{ d['nokey'] }}", {"d": {}}),
    # operators
    ("{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2.5 }}", {}),
    ("{{ 'ab' + 'cd' }} {{ 'ab' ~ 1 ~ none }} {{ '=' * 5 }} {{ [1] + [2, 3] }} {{ 3 * 'x' }}", {}),
    ("{{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ 2 < 3 }} {{ 'b' > 'a' }} {{ 3 <= 3 }} {{ 1 >= 2 }} {{ true == 1 }} {{ [1,2] == [1,2] }}", {}),
    ("{{ 'ell' in 'hello' }} {{ 2 in [1,2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} {{ 'a' in missing }}", {}),
    ("{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ not 0 }} {{ not 'a' }} {{ not x is defined }}", {}),
    ("{{ 'yes' if 1 else 'no' }}|{{ 'yes' if 0 }}|{{ 'a' if false else 'b' if true else 'c' }}", {}),
    ("{{ -x|abs }} {{ x|abs - 1 }} {{ (x + 1) * 2 }} {{ 2 ** 3 ** 2 }}", {"x": 5}),
    # if / for
    ("{% if x > 3 %}big{% elif x > 1 %}mid{% else %}small{% endif %}", {"x": 2}),
    ("{% for m in messages %}{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex }} {{ loop.revindex0 }} {{ loop.first }} {{ loop.last }} {{ m.role }};{% endfor %}", {"messages": MSGS}),
    ("{% for x in xs %}{{ loop.previtem }}>{{ x }}<{{ loop.nextitem }} {% else %}empty{% endfor %}", {"xs": [1, 2, 3]}),
    ("{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}),
    ("{% for x in xs if x % 2 %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}),
    ("{% for x in xs %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", {"xs": [0, 1, 2, 3, 4]}),
    ("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}[{{ k }}]{% endfor %}{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for c in 'héllo' %}{{ c }}.{% endfor %}{% for x in missing %}never{% endfor %}", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}", {}),
    ("{% for i in [1, 2] %}{% if i == 2 %}{{ y }}{% endif %}{% set y = i * 10 %}{% endfor %}", {}),
    ("{% set ns = namespace(n=0, last=none) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.n = ns.n + 1 %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}{{ ns.n }} {{ ns.last }}", {"messages": MSGS}),
    ("{% for i in range(3) %}{{ i }}{% endfor %} {% for i in range(2, 8, 3) %}{{ i }}{% endfor %} {{ range(3)|list }}", {}),
    ("{% for m in messages[::-1] %}{{ m.role[0] }}{% endfor %} {% for m in messages[1:] %}{{ m.role }} {% endfor %}", {"messages": MSGS}),
    ("{% for x in xs %}{% for y in ys %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}", {"xs": ["a", "b"], "ys": [1, 2]}),
    # subscripts and slices
    ("{{ s[0] }} {{ s[-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[::2] }} {{ s[-3:] }} {{ s[:-2] }} {{ s[10:] }}|{{ xs[1] }} {{ xs[-1] }} {{ xs[5] }}|{{ xs[1:] }}", {"s": "héllo wörld", "xs": [1, 2, 3]}),
    ("{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ xs.0 }} {{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }}", {"d": {"a": 1, "b": {"c": 2}}, "xs": [9]}),
    # string methods
    ("{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ s.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}|{{ '  a  b '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}", {"s": "<think>\nplan\n</think>\n\nanswer"}),
    ("[{{ '  x \\n'.strip() }}][{{ 'xxhixx'.strip('x') }}][{{ '\\n\\nhi\\n'.lstrip('\\n') }}][{{ 'hi..'.rstrip('.') }}][{{ ' \\u3000x\\u00a0'.strip() }}]", {}),
    ("{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'ab'.startswith('abc') }}", {}),
    ("{{ 'hÉllo wOrld'.upper() }} {{ 'HÉLLO'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'a-b'.replace('-', '+') }} {{ 'aaa'.replace('a', 'b', 2) }}", {}),
    ("{{ 'héllo'.find('l') }} {{ 'hello'.find('z') }} {{ 'banana'.count('an') }} {{ ', '.join(['a', 'b']) }} {{ '123'.isdigit() }} {{ 'ab1'.isalpha() }}", {}),
    # filters
    ("{{ 'héllo'|length }} {{ [1,2]|length }} {{ {'a':1}|length }} {{ missing|length }} {{ [1,2]|count }}", {}),
    ("{{ d|tojson }}|{{ 'é\"\\n\\t</x>'|tojson }}|{{ [1, 2.5, none, true]|tojson }}|{{ {}|tojson }}|{{ []|tojson }}", {"d": {"b": 1, "a": [1, {"c": "ü"}]}}),
    ("{{ d|tojson(indent=2) }}\n{{ tools|tojson(indent=4) }}\n{{ [[], {}]|tojson(indent=2) }}", {"d": {"b": 1, "a": [1, {"c": "ü"}]}, "tools": TOOLS}),
    ("[{{ '  x  '|trim }}][{{ 'xxyxx'|trim('x') }}][{{ missing|trim }}][{{ 'Hi'|upper }}][{{ 'Hi'|lower }}][{{ 'hi there'|title }}][{{ 'hi'|capitalize }}]", {}),
    ("{{ missing|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ x|d('y') }}", {"x": "set"}),
    ("{{ xs|first }} {{ xs|last }} {{ 'abc'|first }} {{ []|first }}|{{ xs|join(', ') }} {{ xs|join }} {{ xs|reverse|list }} {{ 'abc'|reverse }} {{ 'ab'|list }}", {"xs": [1, 2, 3]}),
    ("{{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|rejectattr('role', 'equalto', 'user')|map(attribute='role')|list }}", {"messages": MSGS}),
    ("{{ [0, 1, '', 'a', none]|select|list }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('even')|list }} {{ ['a', 'b']|map('upper')|list }}", {}),
    ("{{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 4|float }} {{ 5|string ~ 'a' }} {{ [1]|string }}", {}),
    ("{{ d|items|list }} {{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }}", {"d": {"x": 1, "y": [2]}}),
    ("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}", {}),
    ("{{ 'x'|safe }} {{ '<a&b>'|e }} {{ -3|abs }} {{ 'a b'|replace(' ', '_') }}", {}),
    # tests
    ("{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ n is none }} {{ x is none }} {{ x is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is boolean }}", {"x": "s", "n": None}),
    ("{{ d is mapping }} {{ xs is mapping }} {{ xs is iterable }} {{ 's' is iterable }} {{ 1 is iterable }} {{ xs is sequence }} {{ missing is iterable }} {{ x is true }} {{ x is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}", {"d": {}, "xs": [], "x": False}),
    ("{{ 'a' is equalto 'a' }} {{ 2 is eq 3 }} {{ 'a' is in 'cat' }} {{ 2 is in [1, 2] }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ range is callable }} {{ x is not none }}", {"x": 1}),
    # macros and set blocks
    ("{% macro greet(name, punct='!') %}Hello {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} {{ greet('x')|length }}", {}),
    ("{% macro render(c) %}{% if c is string %}{{ c }}{% else %}{% for p in c %}{% if p.type == 'text' %}{{ p.text }}{% else %}<img>{% endif %}{% endfor %}{% endif %}{% endmacro %}{% for m in messages %}[{{ render(m.content)|trim }}]{% endfor %}", {"messages": TOOL_MSGS}),
    ("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("{% set body %}\n  x = {{ 1 + 1 }}\n{% endset %}[{{ body }}]{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{{ t[1] }}", {}),
    ("{{ dict(a=1, b='x') }} {{ namespace(a=1).a }}", {}),
]

# Chat templates written for this test in the styles of common model families.
LLAMA_LIKE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML_DEFAULT_SYSTEM = """{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""

QWEN35_LIKE = """{%- set image_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\\n# Tools\\n\\n<tools>' }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>" }}
    {%- if messages[0].role == 'system' %}
        {{- '\\n\\n' + render_content(messages[0].content, false, true)|trim }}
    {%- endif %}
    {{- '<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content, false, true)|trim + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if loop.index0 > ns.last_query_index %}
            {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content + '\\n</think>\\n\\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\\n\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- else %}
                        {{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}
                {%- endif %}
                {%- if tool_call.arguments is defined %}
                    {%- for args_name, args_value in tool_call.arguments|items %}
                        {{- '<parameter=' + args_name + '>\\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\\n</parameter>\\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- else %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}"""

ALTERNATING = """{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

SPECIAL = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
CASES += [
    (LLAMA_LIKE, dict(SPECIAL, messages=MSGS, add_generation_prompt=True)),
    (LLAMA_LIKE, dict(SPECIAL, messages=[{"role": "user", "content": "  weather?  "}] + TOOL_MSGS[1:3], tools=TOOLS, add_generation_prompt=True)),
    (LLAMA_LIKE, dict(SPECIAL, messages=MSGS[:2], tools=TOOLS, tools_in_user_message=False, date_string="1 Jan 2026", add_generation_prompt=False)),
    (CHATML_DEFAULT_SYSTEM, dict(messages=MSGS[1:], add_generation_prompt=True)),
    (CHATML_DEFAULT_SYSTEM, dict(messages=MSGS, add_generation_prompt=False)),
    (QWEN35_LIKE, dict(messages=MSGS, add_generation_prompt=True)),
    (QWEN35_LIKE, dict(messages=MSGS, add_generation_prompt=True, enable_thinking=False)),
    (QWEN35_LIKE, dict(messages=[MSGS[0]] + TOOL_MSGS, tools=TOOLS, add_generation_prompt=True)),
    (ALTERNATING, dict(messages=[MSGS[1], MSGS[2], MSGS[3]], bos_token="<s>", eos_token="</s>")),
]

ERRORS = [
    (ALTERNATING, dict(messages=MSGS, bos_token="<s>", eos_token="</s>"), "raise_exception: Conversation roles must alternate"),
    (QWEN35_LIKE, dict(messages=[]), "raise_exception: No messages provided."),
    (QWEN35_LIKE, dict(messages=[{"role": "system", "content": [{"type": "image"}]}]), "raise_exception: System message cannot contain images."),
    ("{{ missing.attr }}", {}, "undefined"),
    ("{{ missing + 1 }}", {}, "undefined"),
    ("{{ 'a' + 1 }}", {}, "unsupported operand"),
    ("{{ x|nosuchfilter }}", {"x": 1}, "unknown filter"),
    ("{{ x is nosuchtest }}", {"x": 1}, "unknown test"),
    ("{{ xs.append(1) }}", {"xs": []}, "cannot be modified"),
    ("{% for x in 5 %}{% endfor %}", {}, "cannot loop"),
    ("{{ 1 // 0 }}", {}, "division by zero"),
]


def main():
    e = env()
    out = []
    for src, ctx in CASES:
        out.append({"template": src, "context": ctx, "output": e.from_string(src).render(**ctx)})
    for src, ctx, msg in ERRORS:
        try:
            e.from_string(src).render(**ctx)
        except Exception:
            out.append({"template": src, "context": ctx, "error": msg})
            continue
        sys.exit("error case did not fail in jinja2: " + src)
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tokenizer/jinja-cases.json"
    with open(path, "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{path}: {len(out)} cases (jinja2 {jinja2.__version__})")


if __name__ == "__main__":
    main()
