// Each family's own tool-call syntax, for the tests whose scripted engine (tests/fake_engine.py)
// replies with a tool call a random tiny model never writes: `reply` is what the engine sends,
// `marker` a string only the rendered call contains, `result` how the template renders a tool
// result in the next prompt.
import { FAMILY } from './serve_helper.mjs';

const D = '｜DSML｜';
export const SYNTAX = {
  deepseek_v4: {
    reply: `Let me check.\n\n<${D}tool_calls>\n<${D}invoke name="get_weather">\n`
      + `<${D}parameter name="city" string="true">Paris</${D}parameter>\n`
      + `<${D}parameter name="days" string="false">3</${D}parameter>\n</${D}invoke>\n</${D}tool_calls>`,
    marker: 'DSML',
    result: (text) => `<tool_result>${text}</tool_result>`,
  },
  // The template renders the content stripped, then each call with no whitespace between tags.
  glm: {
    reply: 'Let me check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>'
      + '<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>',
    marker: 'tool_call',
    result: (text) => `<|observation|><tool_response>${text}</tool_response>`,
  },
}[FAMILY.name];
if (!SYNTAX) throw new Error(`no tool-call syntax known for family ${FAMILY.name}: add its reply here`);
