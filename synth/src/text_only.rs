//! Text-only multi-turn conversations, as LLaVA-Instruct mixtures carry them (records with no
//! `image` key): 1 to 4 human/gpt exchanges, answers from one short sentence to a paragraph.
//! Every answer is true (sums add up, letter counts are right, shapes have the sides they have),
//! so a model trained on them learns nothing false.
use crate::layout::Turn;
use crate::scene::{COLOURS, SHAPES};
use rand::seq::SliceRandom;
use rand::Rng;

const WORDS: [&str; 12] = [
    "apple", "river", "mountain", "window", "garden", "pencil", "rainbow", "kitchen", "bicycle",
    "library", "ocean", "lantern",
];
const SIDES: [(&str, &str); 5] = [
    ("triangle", "three"),
    ("square", "four"),
    ("pentagon", "five"),
    ("hexagon", "six"),
    ("octagon", "eight"),
];
const MIXES: [(&str, &str, &str); 4] = [
    ("blue", "yellow", "green"),
    ("red", "yellow", "orange"),
    ("red", "blue", "purple"),
    ("black", "white", "grey"),
];
const STORY_LINES: [&str; 8] = [
    "It lived at the edge of a quiet page, far from the other shapes.",
    "Every morning it rolled to the window to watch the light change.",
    "One day a small breeze carried it across the whole picture.",
    "It met a friendly neighbour who showed it the way back home.",
    "They shared stories about colours they had never seen before.",
    "By evening the sky had turned a soft shade of orange.",
    "It decided that the best adventures begin close to home.",
    "From then on it never felt small again.",
];
const FOLLOW_UPS: [&str; 3] = [
    "Can you explain that in more detail?",
    "Why is that?",
    "Could you say that again in other words?",
];

/// A conversation of 1 to 4 exchanges, starting with the human.
pub(crate) fn conversation(rng: &mut impl Rng) -> Vec<Turn> {
    let exchanges = rng.gen_range(1..=4);
    let mut turns = Vec::with_capacity(2 * exchanges);
    let mut last_detail = String::new();
    for i in 0..exchanges {
        let (question, answer, detail) = if i > 0 && rng.gen_bool(0.3) && !last_detail.is_empty() {
            let follow = FOLLOW_UPS[rng.gen_range(0..FOLLOW_UPS.len())];
            (
                follow.to_string(),
                std::mem::take(&mut last_detail),
                String::new(),
            )
        } else {
            exchange(rng)
        };
        turns.push(Turn::human(question));
        turns.push(Turn::gpt(answer));
        last_detail = detail;
    }
    turns
}

/// One question with its answer and a longer explanation for a possible follow-up.
fn exchange(rng: &mut impl Rng) -> (String, String, String) {
    match rng.gen_range(0..6) {
        0 => {
            let (a, b) = (rng.gen_range(2..100), rng.gen_range(2..100));
            let (q, r, op) = if rng.gen_bool(0.5) {
                ("plus", a + b, "Adding")
            } else {
                ("times", a * b, "Multiplying")
            };
            (
                format!("What is {a} {q} {b}?"),
                format!("{a} {q} {b} is {r}."),
                format!("{op} {a} and {b} gives {r}. You can check it by working digit by digit and carrying where a column goes past nine."),
            )
        }
        1 => {
            let word = WORDS[rng.gen_range(0..WORDS.len())];
            let n = word.chars().count();
            let spelled: Vec<String> = word.chars().map(|c| c.to_uppercase().to_string()).collect();
            (
                format!("How many letters are in the word \"{word}\"?"),
                format!("The word \"{word}\" has {n} letters."),
                format!(
                    "Spelled out, \"{word}\" is {}, which is {n} letters in total.",
                    spelled.join("-")
                ),
            )
        }
        2 => {
            let (shape, sides) = SIDES[rng.gen_range(0..SIDES.len())];
            (
                format!("How many sides does a {shape} have?"),
                format!("A {shape} has {sides} sides."),
                format!("A {shape} is a flat shape with {sides} straight sides and {sides} corners. When all its sides have the same length it is called a regular {shape}."),
            )
        }
        3 => {
            let (a, b, c) = MIXES[rng.gen_range(0..MIXES.len())];
            (
                format!("What colour do you get when you mix {a} and {b}?"),
                format!("Mixing {a} and {b} gives {c}."),
                format!("When you mix {a} paint with {b} paint, the result is {c}. Using more {a} than {b} makes the {c} lean towards {a}."),
            )
        }
        4 => {
            let colour = COLOURS[rng.gen_range(0..COLOURS.len())].0;
            let shape = SHAPES[rng.gen_range(0..SHAPES.len())];
            let mut lines = STORY_LINES.to_vec();
            lines.shuffle(rng);
            let n = rng.gen_range(2..=6);
            (
                format!("Write a short story about a {colour} {shape}."),
                format!("Once upon a time there was a {colour} {shape}. {}", lines[..n].join(" ")),
                format!("The story is about a {colour} {shape} that goes on a small adventure and learns that home is a good place to be."),
            )
        }
        _ => {
            let n = rng.gen_range(2..=5);
            let mut names: Vec<&str> = COLOURS.iter().map(|c| c.0).collect();
            names.shuffle(rng);
            let list: Vec<String> = names[..n]
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{}. {c}", i + 1))
                .collect();
            (
                format!("Name {n} colours."),
                format!("Here are {n} colours:\n{}", list.join("\n")),
                format!("These are common colour names: {}. Each of them describes how an object reflects light.", names[..n].join(", ")),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn conversations_alternate_and_vary_in_length() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut exchange_counts = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let turns = conversation(&mut rng);
            assert!(!turns.is_empty() && turns.len() % 2 == 0);
            for (i, t) in turns.iter().enumerate() {
                assert_eq!(t.from, if i % 2 == 0 { "human" } else { "gpt" });
                assert!(!t.value.is_empty() && !t.value.contains("<image>"));
            }
            exchange_counts.insert(turns.len() / 2);
        }
        assert_eq!(
            exchange_counts.into_iter().collect::<Vec<_>>(),
            vec![1, 2, 3, 4]
        );
    }
}
