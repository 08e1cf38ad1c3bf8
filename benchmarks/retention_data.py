"""The conversations of ``retention.py``: three long chats, each with facts planted early
and a probe question for each fact.

1. ``support``: a customer of a camping shop gives the facts herself;
2. ``tools``: a care agent works a case and the facts come from tool results (JSON);
3. ``debugging``: a colleague debugs a crashing service (versions, ports, codes, hosts).

After the facts come ordinary follow-ups and some chit-chat that never repeat them, so a
fact survives only if compaction kept it. An answer counts when it contains one of the
``expected`` spellings, ignoring case.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from attrs import frozen


@frozen
class ToolStep:
    """A tool call the assistant makes, and the result the tool returns."""

    name: str
    arguments: Mapping[str, str]
    result: str


@frozen
class Turn:
    """One user message, the tool calls it leads to, and the assistant's answer."""

    user: str
    answer: str
    tool_steps: tuple[ToolStep, ...] = ()


@frozen
class Fact:
    """A fact planted early: the question that probes it, its accepted spellings, and
    those of the values it replaced (a correction's superseded value)."""

    question: str
    expected: tuple[str, ...]
    superseded: tuple[str, ...] = ()


@frozen
class Conversation:
    """A scripted conversation and the facts to probe after it."""

    name: str
    instructions: str
    turns: tuple[Turn, ...]
    facts: tuple[Fact, ...]
    uses_tools: bool = False


def _json(**fields: Any) -> str:
    return json.dumps(fields)


def _step(name: str, arguments: Mapping[str, str], /, **result: Any) -> ToolStep:
    return ToolStep(name, arguments, _json(**result))


SUPPORT = Conversation(
    name="support",
    instructions=(
        "You are the customer support assistant of Larkspur Outfitters, an online shop "
        "for camping gear. Be friendly and concise."
    ),
    turns=(
        Turn(
            "Hi there. I'm writing about an order that arrived damaged yesterday. My name is "
            "Ingrid Vasquez-Tanaka.",
            "Hello Ingrid, and thank you for getting in touch. I'm sorry to hear that your "
            "order arrived damaged; that's not the experience we want anyone to have. Could "
            "you give me the order number, so I can look into it and help you sort it out "
            "as quickly as possible?",
        ),
        Turn(
            "Of course, it's LK-58213-Q. I placed it at the start of the month.",
            "Thank you, that's all I need to identify the order. Could you tell me what was "
            "in the parcel and what exactly is damaged? A short description is enough; if "
            "the packaging was also damaged, please mention that too, since it helps us "
            "with the courier claim.",
        ),
        Turn(
            "It's the Halvard 2-person tent, the moss green one. One of the aluminium poles "
            "has snapped in half, and the rainfly has a tear about five centimetres long next "
            "to the door zip. The box was crushed on one corner.",
            "Thank you for the details, and sorry again. A snapped pole, a torn rainfly and a "
            "crushed box all point to damage in transit, which is fully covered by our "
            "delivery guarantee. We can either send you a brand-new replacement tent or give "
            "you a full refund to your original payment method. Which would you prefer?",
        ),
        Turn(
            "A replacement, please. I paid $349.80 for it including express shipping, so I'd "
            "rather not take a refund and then reorder at a different price.",
            "That makes sense, and a replacement it is. It will be sent at no extra cost to "
            "you, and you won't be charged again for shipping either. Where should we send "
            "it? I can use the delivery address from the original order, or a different one "
            "if that suits you better.",
        ),
        Turn(
            "Please send it to my home address: 14 Quayside Lane, Whitby, YO21 3PT. The account "
            "still has my old office address in Leeds, so please don't use that one.",
            "Noted. The replacement will go to your home address and not to the office "
            "address that is still stored on your account. You may also want to update the "
            "address in your account settings at some point, so future orders don't go to "
            "the old office by mistake.",
        ),
        Turn(
            "And could you keep me updated by SMS instead of email? I hardly ever check my "
            "inbox these days.",
            "Of course. I've set this case so that every update, including the dispatch "
            "confirmation and the tracking link, is sent to you by text message rather than "
            "by email. If anything needs your reply, we'll ask by text as well.",
        ),
        Turn(
            "I'm also a Trailblazer loyalty member, number 0047-2291. Does that get me faster "
            "shipping on the replacement?",
            "It does. Trailblazer members get priority dispatch on replacements, so your new "
            "tent should leave our warehouse within one working day instead of the usual "
            "two or three. Your membership also covers free returns, which will be useful "
            "for sending back the damaged tent.",
        ),
        Turn(
            "Good, because we leave for our camping trip on April 12th and I really need the "
            "tent before then.",
            "That should be absolutely fine. With priority dispatch, parcels usually arrive "
            "within two to three working days of leaving the warehouse, which leaves a "
            "comfortable margin before your trip. If anything looks like it might delay it, "
            "we'll let you know straight away.",
        ),
        Turn(
            "What should I do with the broken tent? Do I need to send it back?",
            "Yes, please send it back so the warehouse can inspect it and file the claim "
            "with the courier. We'll send you a prepaid return label. Pack the tent, the "
            "broken pole and the rainfly in the original bag, attach the label, and drop it "
            "off at any post office within 30 days.",
        ),
        Turn(
            "Do I have to return it before the replacement ships, or can I keep it until the "
            "new one arrives?",
            "You can keep it until the new one arrives. The replacement ships first, and the "
            "return only needs to reach us within 30 days, so there's no rush. That way you "
            "won't be left without a tent at any point.",
        ),
        Turn(
            "Great. Can I still use the old one in the garden for the kids in the meantime? "
            "The inner tent is perfectly fine.",
            "Feel free, as long as it comes back reasonably clean and dry. The only thing we "
            "ask is that you don't try to repair or tape the pole or the rainfly, because "
            "the warehouse needs to see the damage as it arrived for the courier claim.",
        ),
        Turn(
            "Makes sense. Unrelated question: we're heading to the Lake District. Any tips for "
            "keeping a tent dry there? Everyone says it rains constantly.",
            "The Lakes certainly earn their reputation! Pitch on slightly raised ground so "
            "water drains away from you, keep the rainfly taut so it never touches the "
            "inner tent, and leave the vents open at night to cut down on condensation. A "
            "footprint under the tent protects the groundsheet and keeps the floor drier, "
            "and a small microfibre towel is handy for wiping the inside in the morning.",
        ),
        Turn(
            "Do you sell a footprint that fits this tent?",
            "Yes, the Halvard footprint is cut to fit the 2-person model exactly, so it won't "
            "stick out and collect rain. It weighs about 200 grams, packs to the size of a "
            "water bottle and costs $39. It clips onto the pole ends, so it stays in place "
            "when you pitch in wind.",
        ),
        Turn(
            "And sleeping pads? My partner always complains that he's cold at night, even in "
            "summer.",
            "Most of the cold at night comes from the ground rather than the air, so an "
            "insulated pad makes a big difference. Look for an R-value of 4 or more for "
            "spring in the hills. The Fellcrest Insulated pad is a popular choice: it's "
            "warm, comfortable for side sleepers and packs small.",
        ),
        Turn(
            "Is that one noisy? Some of those inflatable pads crinkle every time you turn "
            "over, and I'm a light sleeper.",
            "It's quieter than most, because it uses a brushed fabric and synthetic fill "
            "instead of a reflective foil layer, which is what usually causes the crinkling. "
            "Customers rarely mention noise in their reviews, and several say it's the "
            "quietest pad they've owned.",
        ),
        Turn(
            "OK, I might add one later. How long does the warranty on the tent last, by the way?",
            "Our tents carry a two-year warranty against manufacturing defects such as seam "
            "failures, faulty zips or poles that break under normal use. The replacement "
            "counts as a new product, so it starts a fresh two-year warranty from the day it "
            "is delivered.",
        ),
        Turn(
            "Nice. Will the replacement come with new pegs too, or just the tent itself?",
            "It's a complete new tent, exactly as you'd get from a new order: the inner "
            "tent, the rainfly, the full pole set, pegs, guy lines and the carry bag. You "
            "can keep everything together and simply send the old set back in its bag.",
        ),
        Turn(
            "My daughter wants to know if the tent is big enough for her and the dog if we "
            "bring a second tent for the adults.",
            "It should be. The inner floor is about 210 by 130 cm, with a porch on one side "
            "for boots and bags, so a child and a medium-sized dog would fit comfortably. "
            "The porch is also a good spot for a dog bed if he prefers a bit of space.",
        ),
        Turn(
            "Ha, she'll be thrilled. The dog is a very fluffy collie, so hopefully he doesn't "
            "bring half the hillside in with him every evening.",
            "Collies make great camping companions, and they usually love the hills! A small "
            "towel by the door works wonders for muddy paws, and a cheap fleece blanket on "
            "the floor keeps most of the fur off the sleeping bags.",
        ),
        Turn(
            "Good idea. What about cooking? We have an old gas stove but I'm not sure which "
            "canisters fit it.",
            "Most backpacking stoves take threaded screw-on canisters, the EN417 standard. "
            "If your stove screws onto the top of the canister, any of our 230 g or 450 g "
            "canisters will fit. If it uses a clip or a pierceable cartridge instead, let me "
            "know the brand and I'll check which refills you need.",
        ),
        Turn(
            "It does screw on. Can I take gas canisters on the train, though? We're not "
            "driving this time.",
            "Small sealed camping gas canisters are generally allowed on UK trains for "
            "personal use, but the rules differ a little between operators, so check your "
            "train company's website before you travel. Keep the canisters in your luggage, "
            "away from heat, and never carry a stove with a canister still attached.",
        ),
        Turn(
            "Will do. Is there anywhere near Keswick where I could buy canisters instead of "
            "carrying them?",
            "Yes, Keswick has several outdoor shops in the town centre, and they all stock "
            "screw-on canisters, usually in both sizes. Buying them there is the easiest "
            "option if you're arriving by train, and it saves you some weight on the way.",
        ),
        Turn(
            "Perfect, that saves some weight. Is there a discount if I buy the footprint and "
            "the pad together?",
            "I can't create discount codes in this chat, but during the spring sale any two "
            "accessories bought together get 10% off automatically at checkout. The "
            "footprint and the pad both count as accessories, so you'd get the discount "
            "without doing anything.",
        ),
        Turn(
            "When does the spring sale end?",
            "The spring sale runs until the end of this month, so you still have a little "
            "time to decide.",
        ),
        Turn(
            "While I have you: the kids need rain jackets too. Anything you'd recommend for a "
            "seven- and a ten-year-old?",
            "The Brackenridge kids' jacket is our most popular one for that age. It's fully "
            "waterproof with taped seams, has a hood that stays on in wind, and the sleeves "
            "have a grow-with-me cuff that adds about a year of wear. It comes in sizes from "
            "5-6 up to 13-14.",
        ),
        Turn(
            "They grow so fast, that cuff sounds perfect. What about midges? I've heard "
            "horror stories about Scotland, is the Lake District as bad?",
            "It's usually not as bad as the west of Scotland, but midges can still appear on "
            "still, damp evenings, especially near water. A repellent with DEET or picaridin "
            "works well, and a head net weighs almost nothing. The Halvard's inner tent has "
            "a fine mesh, so they stay outside once you zip up.",
        ),
        Turn(
            "Good to know. Should I bring headlamps for everyone, or is one lantern enough?",
            "A headlamp each is worth it, especially with kids: everyone can find their own "
            "things and go to the toilet block at night without waking the others. A small "
            "lantern hanging in the porch is a nice extra for cooking and card games.",
        ),
        Turn(
            "Card games, yes! The kids will love that. Do you sell a waterproof deck?",
            "We do: a plastic waterproof deck that survives rain and muddy hands for $12. "
            "It's a favourite for family trips, and it fits in a jacket pocket.",
        ),
        Turn(
            "Adding that to the list. Will I get the tracking link for the replacement as "
            "soon as it leaves the warehouse?",
            "Yes, the tracking link is sent as soon as the courier scans the parcel, usually "
            "within a few hours of it leaving the warehouse. You can follow the delivery "
            "from there and pick a safe place if you won't be home.",
        ),
        Turn(
            "We might be out that day, so a safe place would be handy. Our neighbour usually "
            "takes parcels.",
            "Then you can choose 'leave with a neighbour' from the tracking page and name "
            "them. The courier leaves a card saying where the parcel went.",
        ),
        Turn(
            "OK. Last thing about the return: does the label cover the postage, or do I pay "
            "first and get the money back later?",
            "The label is prepaid, so there's nothing to pay at the post office. Just hand "
            "over the parcel and keep the receipt with the tracking number until we confirm "
            "that the return has arrived.",
        ),
        Turn(
            "Lovely. Sorry for all the questions, it's our first proper camping trip with the "
            "kids and I want everything to go well.",
            "No need to apologise at all; that's exactly what we're here for. A first camping "
            "trip with the kids is a big adventure, and a bit of preparation makes it much "
            "more relaxed. It sounds like it's going to be a wonderful trip.",
        ),
        Turn(
            "Fingers crossed for good weather. Thanks for being so patient and helpful.",
            "You're very welcome. I hope the sun shines for you, and if it doesn't, you'll be "
            "well prepared. Enjoy the fells, and let us know if anything else comes up.",
        ),
        Turn(
            "Oh, one more: can the kids' sleeping bags go in the washing machine?",
            "Most synthetic bags can, on a gentle cycle at 30°C with a technical wash instead "
            "of normal detergent, then tumble-dried on low heat. Down bags need a special "
            "down wash and a long, gentle drying with a few tennis balls to restore the loft. "
            "Always check the care label first.",
        ),
    ),
    facts=(
        Fact("Can you remind me of my order number?", ("LK-58213-Q",)),
        Fact("What is my surname, as I gave it to you?", ("Vasquez-Tanaka", "Vasquez Tanaka")),
        Fact("What colour is the tent I ordered?", ("moss green", "moss-green")),
        Fact("How much did I pay for the order?", ("349.80", "349,80", "349.8")),
        Fact("Which town should the replacement be sent to?", ("Whitby",)),
        Fact("How did I ask you to keep me updated?", ("SMS", "text message", "by text")),
        Fact("What is my loyalty member number?", ("0047-2291", "0047 2291", "00472291")),
        Fact(
            "On what date do we leave for our camping trip?",
            (
                "April 12",
                "April 12th",
                "12 April",
                "12th April",
                "12th of April",
                "Apr 12",
                "12 Apr",
            ),
        ),
    ),
)

_CUSTOMS_ORDER = "SO-772190"
_CUSTOMS_TRACKING = "1Z94A7E60391284415"
_CABLE_TRACKING = "1Z94A7E60388210377"

TOOLS = Conversation(
    name="tools",
    instructions=(
        "You are the assistant of the customer care team of Brightwave Electronics. Look "
        "things up with the tools and answer the care agent briefly."
    ),
    uses_tools=True,
    turns=(
        Turn(
            "Customer C-40917 is on the phone about a late delivery. Can you pull up the account?",
            f"That's Dominik Ferreira. He has one open order, {_CUSTOMS_ORDER}.",
            (
                _step(
                    "get_account",
                    {"customer_id": "C-40917"},
                    customer_id="C-40917",
                    name="Dominik Ferreira",
                    tier="Gold",
                    member_since="2019-06-14",
                    store_credit_eur=82.15,
                    preferred_language="Portuguese",
                    phone="+351 912 604 118",
                    open_orders=[_CUSTOMS_ORDER],
                    notes="Prefers phone calls after 17:00.",
                ),
            ),
        ),
        Turn(
            "Yes, that's the one he's calling about. What's in it?",
            "Two 27-inch 4K monitors and a Thunderbolt 4 dock, placed on 8 November and "
            "already shipped.",
            (
                _step(
                    "lookup_order",
                    {"order_id": _CUSTOMS_ORDER},
                    order_id=_CUSTOMS_ORDER,
                    placed="2024-11-08",
                    status="shipped",
                    items=[
                        {
                            "sku": "MON-27Q-4K",
                            "name": "Vistra 27-inch 4K monitor",
                            "qty": 2,
                            "unit_eur": 489.0,
                        },
                        {
                            "sku": "DOCK-TB4",
                            "name": "Thunderbolt 4 dock",
                            "qty": 1,
                            "unit_eur": 306.6,
                        },
                    ],
                    total_eur=1284.6,
                    payment="Visa ending 4471",
                    ship_from="Rotterdam-2",
                    tracking=_CUSTOMS_TRACKING,
                ),
            ),
        ),
        Turn(
            "Where is the parcel right now?",
            "It's held at customs because the commercial invoice is missing.",
            (
                _step(
                    "track_shipment",
                    {"tracking_number": _CUSTOMS_TRACKING},
                    tracking_number=_CUSTOMS_TRACKING,
                    carrier="UPS",
                    status="held_at_customs",
                    location="Leipzig hub",
                    held_since="2024-11-13",
                    reason="missing commercial invoice",
                    new_estimated_delivery="2024-11-19",
                    events=14,
                ),
            ),
        ),
        Turn(
            "He's worried one of the monitors will arrive damaged after all this. Do we have "
            "that monitor in stock if we need to swap it?",
            "Yes, there are units available, so a swap would be possible.",
            (
                _step(
                    "check_inventory",
                    {"sku": "MON-27Q-4K"},
                    sku="MON-27Q-4K",
                    available=7,
                    reserved=3,
                    warehouse="Antwerp",
                    next_restock="2024-12-02",
                    backorder_allowed=False,
                ),
            ),
        ),
        Turn(
            "Please open a ticket so logistics sends the invoice to customs.",
            "Done, the ticket is with the logistics team at high priority.",
            (
                _step(
                    "create_ticket",
                    {
                        "customer_id": "C-40917",
                        "summary": f"{_CUSTOMS_ORDER} held at customs: commercial invoice missing",
                    },
                    ticket_id="TCK-30581",
                    queue="Logistics EU",
                    priority="high",
                    sla_hours=24,
                    assignee="Marta Kowalczyk",
                    created="2024-11-14T10:42:00Z",
                ),
            ),
        ),
        Turn(
            "He also asked about a USB-C cable order from last month, SO-765402. Did that arrive?",
            "Yes, the three cables were delivered on 24 October.",
            (
                _step(
                    "lookup_order",
                    {"order_id": "SO-765402"},
                    order_id="SO-765402",
                    placed="2024-10-21",
                    status="delivered",
                    items=[
                        {
                            "sku": "CBL-USBC-2M",
                            "name": "USB-C cable 2 m",
                            "qty": 3,
                            "unit_eur": 14.9,
                        }
                    ],
                    total_eur=44.7,
                    payment="PayPal",
                    ship_from="Rotterdam-2",
                    tracking=_CABLE_TRACKING,
                    delivered="2024-10-24",
                ),
            ),
        ),
        Turn(
            "He says he only got two of the three cables. Can you check the delivery details?",
            "It was delivered and signed for. The recorded weight fits three cables, but "
            "tracking alone can't confirm how many were in the box.",
            (
                _step(
                    "track_shipment",
                    {"tracking_number": _CABLE_TRACKING},
                    tracking_number=_CABLE_TRACKING,
                    carrier="UPS",
                    status="delivered",
                    location="Porto",
                    delivered_at="2024-10-24T14:05:00",
                    signed_by="FERREIRA",
                    weight_kg=0.31,
                    events=9,
                ),
            ),
        ),
        Turn(
            "Fair enough, it's only a cable. Is it in stock so we can just send him one?",
            "Yes, there is plenty in stock at Rotterdam-2.",
            (
                _step(
                    "check_inventory",
                    {"sku": "CBL-USBC-2M"},
                    sku="CBL-USBC-2M",
                    available=412,
                    reserved=18,
                    warehouse="Rotterdam-2",
                    next_restock=None,
                    backorder_allowed=True,
                ),
            ),
        ),
        Turn(
            "Great, open a ticket to send him one cable free of charge.",
            "Done, fulfilment will send him the cable.",
            (
                _step(
                    "create_ticket",
                    {
                        "customer_id": "C-40917",
                        "summary": "Send 1x CBL-USBC-2M free of charge: short shipment on SO-765402",
                    },
                    ticket_id="TCK-30594",
                    queue="Fulfilment",
                    priority="normal",
                    sla_hours=48,
                    assignee="Jonas Becker",
                    created="2024-11-14T10:51:00Z",
                ),
            ),
        ),
        Turn(
            "He's now asking whether the dock works with his laptop, a 2021 MacBook Pro. Any idea?",
            "Yes, Thunderbolt 4 docks work with the 2021 MacBook Pro. With an M1 Pro chip it "
            "drives two external displays, so both monitors will work through the dock.",
        ),
        Turn(
            "He mentioned he's a wedding photographer, that's why he wanted two 4K screens. "
            "Fun fact of the day.",
            "That makes sense; colour-accurate 4K screens are popular with photographers for "
            "editing.",
        ),
        Turn(
            "He also asked about a gift order for his sister, SO-770015. Can you check it?",
            "The headphones are still being processed, with gift wrap, and haven't shipped yet.",
            (
                _step(
                    "lookup_order",
                    {"order_id": "SO-770015"},
                    order_id="SO-770015",
                    placed="2024-11-02",
                    status="processing",
                    items=[
                        {
                            "sku": "HP-NC700",
                            "name": "NC700 noise-cancelling headphones",
                            "qty": 1,
                            "unit_eur": 229.0,
                        }
                    ],
                    total_eur=229.0,
                    payment="Mastercard ending 0926",
                    ship_from="Antwerp",
                    tracking=None,
                    gift_wrap=True,
                ),
            ),
        ),
        Turn(
            "Why is it still processing after twelve days?",
            "The headphones are out of stock. The next restock is on 22 November, and the "
            "order is waiting for it.",
            (
                _step(
                    "check_inventory",
                    {"sku": "HP-NC700"},
                    sku="HP-NC700",
                    available=0,
                    reserved=26,
                    warehouse="Antwerp",
                    next_restock="2024-11-22",
                    backorder_allowed=True,
                ),
            ),
        ),
        Turn(
            "Open a ticket asking fulfilment to prioritise the gift order when stock arrives.",
            "Done, fulfilment will prioritise it as soon as the stock arrives.",
            (
                _step(
                    "create_ticket",
                    {
                        "customer_id": "C-40917",
                        "summary": "Prioritise gift order SO-770015 when HP-NC700 restocks",
                    },
                    ticket_id="TCK-30602",
                    queue="Fulfilment",
                    priority="normal",
                    sla_hours=48,
                    assignee="Jonas Becker",
                    created="2024-11-14T11:03:00Z",
                ),
            ),
        ),
        Turn(
            "He's happy now and hung up. Is customer C-41388 my next callback?",
            "Yes, Aiko Lindqvist asked for a callback about a warranty claim.",
            (
                _step(
                    "get_account",
                    {"customer_id": "C-41388"},
                    customer_id="C-41388",
                    name="Aiko Lindqvist",
                    tier="Silver",
                    member_since="2022-02-01",
                    store_credit_eur=0.0,
                    preferred_language="Swedish",
                    phone="+46 70 318 22 90",
                    open_orders=[],
                    notes="Callback requested about a warranty claim.",
                ),
            ),
        ),
        Turn(
            "Before I call her: Dominik said he'll be travelling next week. Should I log that "
            "somewhere?",
            "Yes, add it to his account notes and to the customs ticket, so logistics knows "
            "when a delivery can actually be received.",
        ),
        Turn(
            "Done. Long morning, that was my ninth call already and it's not even lunch.",
            "That's a busy morning! Take a short break before the next callback if you can.",
        ),
        Turn(
            "Good idea, coffee first. Thanks for the quick lookups today.",
            "You're welcome. Enjoy the coffee, and I'll be here for the next call.",
        ),
    ),
    facts=(
        Fact("What loyalty tier is customer C-40917 on?", ("Gold",)),
        Fact("How much store credit does customer C-40917 have?", ("82.15", "82,15")),
        Fact("What is the preferred language of customer C-40917?", ("Portuguese",)),
        Fact(f"What was the total of order {_CUSTOMS_ORDER}?", ("1284.6", "1,284.6", "1 284.6")),
        Fact(
            f"What are the last four digits of the card that paid for {_CUSTOMS_ORDER}?", ("4471",)
        ),
        Fact(f"In which city is the {_CUSTOMS_ORDER} parcel held at customs?", ("Leipzig",)),
        Fact(
            f"What is the new estimated delivery date of {_CUSTOMS_ORDER}?",
            ("2024-11-19", "19 November", "November 19", "19 Nov", "Nov 19", "19/11", "11/19"),
        ),
        Fact("What is the ticket number for the customs problem?", ("TCK-30581",)),
    ),
)

DEBUGGING = Conversation(
    name="debugging",
    instructions=(
        "You are a senior site reliability engineer helping a colleague debug a service. "
        "Answer concisely."
    ),
    turns=(
        Turn(
            "Hey, can you help me debug ledger-sync? Since yesterday's deploy it keeps "
            "crashing in the payments-staging namespace, and the pod has restarted about "
            "forty times overnight.",
            "Sure, let's look at it together. First, what does the crash look like: does the "
            "process exit with an error in the logs, or is the pod being killed from outside, "
            "for example by the OOM killer or a failing probe? kubectl describe pod shows the "
            "last termination reason, which is a good place to start.",
        ),
        Turn(
            "The logs end with error code LSYNC-4093 right before the container exits, and "
            "describe pod says the last state was Error with exit code 1. It happens every "
            "10 to 20 minutes.",
            "Exit code 1 after an application error means the process is exiting on its own, "
            "so this isn't the OOM killer. Do you know what that error code means in your "
            "codebase? And which commit went out with yesterday's deploy?",
        ),
        Turn(
            "LSYNC-4093 is our generic 'replication read failed' error. The deploy was commit "
            "9f3c2ab, which mostly upgraded dependencies; there were no functional changes "
            "in the service code itself.",
            "A dependency-only deploy that starts failing on reads narrows it down nicely. "
            "Which dependencies changed? A database driver upgrade is the first suspect for "
            "read failures, followed by anything that touches connection pooling or timeouts.",
        ),
        Turn(
            "psycopg went from 3.1.12 to 3.1.18, plus a couple of logging libraries. The "
            "database itself is PostgreSQL 15.4 and hasn't changed in months.",
            "Good, so the server side is stable and the driver is the main change. Next "
            "question: where does ledger-sync read from, the primary or a replica? Failures "
            "that only show up on reads often have to do with replicas.",
        ),
        Turn(
            "From a read replica, db-replica-03.eu-west.internal. All writes go to the "
            "primary, and the replica is only used by this service and by reporting.",
            "Reads on a hot standby that fail every so often are frequently queries being "
            "cancelled because of replication conflicts: the replica has to apply changes "
            "from the primary and cancels queries that are in the way. What's the statement "
            "timeout on that connection?",
        ),
        Turn(
            "statement_timeout is set to 45 seconds in the service config. The replica's "
            "max_standby_streaming_delay is still the default of 30 seconds.",
            "That's a plausible cause. With a 30-second standby delay, a long read on the "
            "replica can be cancelled by recovery well before your own timeout fires. So the "
            "service would see a cancelled query rather than a timeout, which may be handled "
            "differently in your code.",
        ),
        Turn(
            "The service listens on port 7412, and the health check hits /healthz on that "
            "port every 10 seconds. Could the health check be part of it?",
            "Possibly, depending on what /healthz does. If it queries the database and that "
            "query fails or hangs, the check fails, and after a few failures Kubernetes "
            "restarts the pod. That would look a lot like what you describe, so it's worth "
            "checking what the handler does.",
        ),
        Turn(
            "It does: /healthz runs SELECT 1 against the replica. That should be instant, though.",
            "SELECT 1 itself is instant, but it needs a connection from the pool first. If "
            "every pooled connection is stuck in a long query, the health check waits for a "
            "connection and times out. The exit code 1 suggests the crash is the error "
            "itself, though, so the health check is probably a secondary effect.",
        ),
        Turn(
            "How can I confirm the replication conflict theory?",
            "On the replica, look at the pg_stat_database_conflicts view for your database. "
            "If the confl_snapshot column keeps growing, queries are being cancelled by "
            "recovery conflicts. Take two readings an hour apart to see the rate.",
        ),
        Turn(
            "confl_snapshot went from 112 to 187 in the last hour. So that's it?",
            "That's strong evidence: 75 cancellations in an hour is a lot for one service. To "
            "be sure, search the service logs for the message 'canceling statement due to "
            "conflict with recovery' just before each crash. If it's always there, you have "
            "your cause.",
        ),
        Turn(
            "Found it, that message shows up a few seconds before every crash. But why would "
            "this start after a driver upgrade? The conflicts must have happened before too.",
            "They probably did. The difference is likely in how the new driver version "
            "surfaces the cancelled query: it may now raise a different exception class, one "
            "your service doesn't catch, so the process exits instead of retrying. Check the "
            "driver's changelog for changes to error handling.",
        ),
        Turn(
            "Makes sense, our retry wrapper only catches OperationalError. What are our options?",
            "There are three main options. You can enable hot_standby_feedback on the "
            "replica, raise max_standby_streaming_delay so queries get more time, or make "
            "the service retry cancelled queries. The last one is the most robust, because "
            "it also covers failovers and other transient errors.",
        ),
        Turn(
            "What's the downside of hot_standby_feedback?",
            "With feedback on, the replica tells the primary which rows its queries still "
            "need, so vacuum on the primary keeps them. That can bloat tables on the primary "
            "while long queries run on the replica. With short queries it's usually fine.",
        ),
        Turn(
            "Our longest query is the nightly reconciliation, which takes about 8 minutes. "
            "Would that cause much bloat?",
            "Eight minutes of held-back vacuum is usually tolerable. It becomes a problem "
            "when the same tables get very heavy update traffic on the primary, because every "
            "updated row leaves a dead version behind that can't be cleaned up until the "
            "query finishes.",
        ),
        Turn(
            "The ledger tables get a lot of updates, so maybe retries are the better fix.",
            "Agreed, retries it is. Catch the cancellation, which PostgreSQL reports as "
            "SQLSTATE 40001, retry with exponential backoff and cap the number of attempts so "
            "a real outage still surfaces as an error instead of an endless loop.",
        ),
        Turn(
            "How many retries would you do?",
            "Three attempts with backoff starting at 200 milliseconds, doubling each time, is "
            "a sensible default. Log every retry with the SQLSTATE, so you can see how often "
            "it happens and notice if the rate changes.",
        ),
        Turn(
            "And the health check? A slow query still shouldn't get the pod killed.",
            "Split it. Keep the liveness probe in-process with no database call, so it only "
            "fails when the process is truly stuck, and move the database check to the "
            "readiness probe. A slow replica then takes the pod out of rotation for a while "
            "instead of restarting it.",
        ),
        Turn(
            "Good point. The readiness probe timeout is 1 second by default, right?",
            "Yes, timeoutSeconds defaults to 1, which is tight for anything that touches a "
            "database over the network. For a database check, 2 or 3 seconds is safer, "
            "together with a failureThreshold of 3 so a single slow check doesn't flap.",
        ),
        Turn(
            "I'll set it to 3. Should the health check get its own connection pool too?",
            "A small dedicated pool of one or two connections is a nice touch. It means a "
            "busy main pool can't make the service look unhealthy, and the health check "
            "can't steal connections from real work either.",
        ),
        Turn(
            "OK. Should the retry wrapper live in the repository layer or around each query?",
            "Put it in the repository layer, around whole read transactions, so a retry "
            "replays the entire unit of work rather than a single statement. Retrying one "
            "statement in the middle of a transaction doesn't work once the transaction has "
            "been aborted.",
        ),
        Turn(
            "Done, and the tests pass locally. How do I test the conflict case without a real "
            "replica?",
            "Use a fake connection that raises the driver's error on the first call and "
            "succeeds on the second. That covers the retry path without a database. Add a "
            "second test where it fails every time, to check that the cap works and the "
            "error still reaches the caller.",
        ),
        Turn(
            "Nice, added both tests. I'll deploy to staging after lunch.",
            "Sounds good. After the deploy, watch the restart count and the retry logs for "
            "an hour or so; the conflicts happen every few minutes, so an hour gives you "
            "enough data to be confident.",
        ),
        Turn(
            "Speaking of lunch, the new ramen place across the street finally opened today. "
            "The queue was out of the door this morning.",
            "Enjoy! Debugging always goes better on a full stomach, and a queue like that is "
            "usually a good sign.",
        ),
        Turn(
            "While we wait: is the pool size of 20 connections in ledger-sync reasonable, or "
            "did that make things worse?",
            "Twenty is reasonable for one service against one replica. A smaller pool would "
            "not have prevented the conflicts, and a much bigger one just spreads more long "
            "queries across the replica. Keep it and look at the pool wait time metric.",
        ),
        Turn(
            "We don't export pool metrics at all. Is that easy to add?",
            "Usually, yes. The pool can report its size, the connections in use and the time "
            "spent waiting for a connection. Expose those as gauges and a histogram on the "
            "metrics endpoint, and add a panel next to the restart count.",
        ),
        Turn(
            "I'll add that to the follow-ups. By the way, I checked the driver changelog and "
            "you were right: the new version raises a more specific exception for query "
            "cancellation.",
            "That explains it neatly. The new exception is probably no longer a subclass of "
            "the one your wrapper catches, so it went straight through. It's worth grepping "
            "for other except clauses that relied on the old behaviour.",
        ),
        Turn(
            "Good idea, I found two more places in the export job. I'll fix those in the "
            "same pull request.",
            "Great. Add a test for each, the same way as for the repository layer, so the "
            "next driver upgrade can't quietly break them again.",
        ),
        Turn(
            "Do other teams use the same driver version? They might hit the same thing.",
            "Quite possibly. A quick search of the dependency files across the repositories "
            "will tell you. Any service that reads from a replica and catches the old "
            "exception class is at risk, so post a short heads-up in the platform channel.",
        ),
        Turn(
            "Posted. Someone from the billing team already replied that they pinned the old "
            "version last week for a different reason.",
            "Lucky them. Ask them to mention it in their upgrade notes, so whoever unpins it "
            "later knows to check the exception handling first.",
        ),
        Turn(
            "Will do. Unrelated, but are you on call this weekend? I'm on the rotation from "
            "Friday evening.",
            "Not this weekend, I'm off until Monday. If ledger-sync acts up, the retry logs "
            "and the conflict counter are the first things to check, and the incident note "
            "will have the rest.",
        ),
        Turn(
            "Fair. Hopefully it's a quiet one, I've got tickets for a concert on Saturday.",
            "Fingers crossed! Keep the laptop charged just in case, but with the fix in place "
            "it should be calm.",
        ),
        Turn(
            "Back, and deployed. No restarts in 40 minutes, and the retry log shows 6 retries, "
            "all of them successful on the second attempt.",
            "That's a good result. Few retries, all succeeding on the second attempt, points "
            "to short conflicts that the backoff absorbs easily. It also confirms that the "
            "crashes came from the uncaught cancellation and nothing else.",
        ),
        Turn(
            "Should I still raise max_standby_streaming_delay?",
            "Not for now. With retries in place, leave it as it is and revisit only if the "
            "retry rate climbs. Raising it also delays replication during long queries, "
            "which the reporting users would notice as stale data.",
        ),
        Turn(
            "OK. I'll write a short incident note for the team. Anything I should include?",
            "Include the symptom, the root cause (recovery conflicts plus an error the "
            "service stopped catching after the driver upgrade), the fix, and follow-ups such "
            "as the probe split and a check of the other services that use the same driver.",
        ),
        Turn(
            "Should we also alert on confl_snapshot, so we catch this earlier next time?",
            "Yes, alert on its rate of increase rather than the absolute value, say more than "
            "50 conflicts in 10 minutes. That way the next regression shows up as an alert "
            "long before it causes crashes.",
        ),
        Turn(
            "The incident note is up for review. One of the reviewers asks whether we should "
            "move the reconciliation job to its own replica.",
            "It's a reasonable long-term idea: long analytical queries and latency-sensitive "
            "reads don't mix well on one standby. It's not urgent with retries in place, so "
            "add it as a follow-up with a rough cost estimate rather than doing it now.",
        ),
        Turn(
            "Makes sense, I'll put it in the backlog. Any quick win I could do today instead?",
            "Add the confl_snapshot alert and the pool metrics today; both are small and "
            "make the next incident much easier to diagnose. The probe split can go out "
            "with the next regular release.",
        ),
        Turn(
            "Done with the alert. It fired once in the test environment, which I guess "
            "proves it works.",
            "A test firing is the best kind of firing. Tune the threshold after a week of "
            "real data if it turns out too noisy.",
        ),
        Turn(
            "Will do. Thanks, this would have taken me all day on my own.",
            "Happy to help. Nice work spotting that log line so quickly; that was the key "
            "piece of evidence.",
        ),
    ),
    facts=(
        Fact("Which Kubernetes namespace is ledger-sync crashing in?", ("payments-staging",)),
        Fact("What error code did the logs show before each crash?", ("LSYNC-4093",)),
        Fact("Which commit was deployed yesterday?", ("9f3c2ab",)),
        Fact("Which psycopg version are we running now?", ("3.1.18",)),
        Fact("Which PostgreSQL version does the database run?", ("15.4",)),
        Fact("What is the hostname of the read replica?", ("db-replica-03",)),
        Fact(
            "What is the statement_timeout in the service config?",
            ("45 s", "45s", "45 seconds", "45-second"),
        ),
        Fact("Which port does ledger-sync listen on?", ("7412",)),
    ),
)

CONVERSATIONS = (SUPPORT, TOOLS, DEBUGGING)
"""The conversations, in the order they run."""
